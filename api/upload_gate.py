"""Admission for multipart uploads before their body is read: a tenant over its upload
limits, or a process whose spool space is taken, is refused before a byte is spooled."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from loraplex.platform.errors import HttpError

SPOOL_RETRY_AFTER_S = 5


class UploadGate:
    """Per process: uploads being received per tenant, and spool bytes reserved in all."""

    def __init__(self, max_spool_bytes: int) -> None:
        self.max_spool_bytes = max_spool_bytes
        self._lock = threading.Lock()
        self._reserved = 0
        self._per_tenant: dict[uuid.UUID, int] = {}

    def in_flight(self, tenant_id: uuid.UUID) -> int:
        """Uploads of `tenant_id` this process is receiving now."""
        with self._lock:
            return self._per_tenant.get(tenant_id, 0)

    @contextmanager
    def receiving(self, tenant_id: uuid.UUID, size: int) -> Iterator[None]:
        """Hold `size` bytes of spool space while one upload's body is read (503 when the
        process has none left)."""
        with self._lock:
            if self._reserved + size > self.max_spool_bytes:
                raise HttpError(
                    503,
                    "The API is receiving too many uploads right now; retry shortly.",
                    type="service_unavailable",
                    code="upload_capacity",
                    headers={"retry-after": str(SPOOL_RETRY_AFTER_S)},
                )
            self._reserved += size
            self._per_tenant[tenant_id] = self._per_tenant.get(tenant_id, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._reserved -= size
                left = self._per_tenant[tenant_id] - 1
                if left:
                    self._per_tenant[tenant_id] = left
                else:
                    del self._per_tenant[tenant_id]

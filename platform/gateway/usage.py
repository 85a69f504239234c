"""Usage metering: one record per request (prompt, cached and completion tokens, latency,
adapter version), written to PostgreSQL in batches off the request path. The roll-up
`GET /v1/usage` returns is `services/usage_report.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import UsageRecord

log = logging.getLogger(__name__)


@dataclass
class Usage:
    """What one request used."""

    tenant_id: uuid.UUID
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    latency_ms: int = 0
    api_key_id: uuid.UUID | None = None
    deployment_id: uuid.UUID | None = None
    adapter_version_id: uuid.UUID | None = None
    ttft_ms: int | None = None
    itl_ms: float | None = None
    failed: bool = False

    def row(self) -> dict[str, Any]:
        """The insert row."""
        return asdict(self)


def write_batch(factory: sessionmaker[Session], batch: list[Usage]) -> None:
    """Insert `batch` in one statement and one transaction."""
    if not batch:
        return
    with factory() as session, session.begin():
        session.execute(insert(UsageRecord), [u.row() for u in batch])


class UsageRecorder:
    """Buffers usage and flushes it every `interval_s` or `batch_size` records."""

    def __init__(
        self, factory: sessionmaker[Session], batch_size: int = 100, interval_s: float = 1.0
    ) -> None:
        self._factory = factory
        self._batch_size = batch_size
        self._interval = interval_s
        self._pending: list[Usage] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.flushed_batches = 0

    def record(self, usage: Usage) -> None:
        """Queue one record (never blocks the request)."""
        self._pending.append(usage)
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    def start(self) -> None:
        """Start the background flusher on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            try:
                await self.flush()
            except Exception:  # keep metering alive; the batch is retried next time
                log.exception("usage flush failed; will retry")

    async def flush(self) -> int:
        """Write everything pending now; returns how many records were written."""
        async with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return 0
            try:
                await asyncio.to_thread(write_batch, self._factory, batch)
            except Exception:
                self._pending[:0] = batch
                raise
            self.flushed_batches += 1
            return len(batch)

    async def stop(self) -> None:
        """Stop the flusher and write what is left."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

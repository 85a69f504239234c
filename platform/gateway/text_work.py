"""A bounded pool for the CPU-heavy part of a request (parsing a large JSON body, rendering
the chat template, tokenizing), so the gateway's event loop only waits: one tenant's long
prompt never delays another's request. Sized to the cores; when more requests wait for it
than `queue_limit`, new ones get 503 `server_busy` at once instead of queueing without end."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from loraplex.platform.errors import HttpError

P = ParamSpec("P")
T = TypeVar("T")
BUSY_RETRY_AFTER_S = 1


def busy() -> HttpError:
    """The 503 for a request that found the pool's queue full."""
    return HttpError(
        503,
        "The gateway is busy; retry shortly.",
        type="service_unavailable",
        code="server_busy",
        headers={"retry-after": str(BUSY_RETRY_AFTER_S)},
    )


class TextWorkers:
    """Run blocking text work in `workers` threads, at most `queue_limit` waiting."""

    def __init__(self, workers: int = 0, queue_limit: int = 256) -> None:
        self.workers = workers if workers > 0 else (os.cpu_count() or 1)
        self.queue_limit = queue_limit
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="loraplex-text")
        self._pending = 0

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished (running or waiting)."""
        return self._pending

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on the pool; raises `busy()` when too many already wait."""
        if self._pending >= self.workers + self.queue_limit:
            raise busy()
        self._pending += 1
        try:
            future = self._pool.submit(fn, *args, **kwargs)
            return await asyncio.wrap_future(future)
        finally:
            self._pending -= 1

    def close(self) -> None:
        """Stop the threads (work already submitted finishes)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

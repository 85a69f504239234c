"""A bounded pool for the CPU-heavy part of a request (parsing a large JSON body, rendering
the chat template, tokenizing), so the gateway's event loop only waits. Tenants take turns
for its threads: waiting jobs are queued per tenant and a freed thread goes to the next tenant
in round-robin order, so one tenant's queue of long prompts never holds another's request
behind it. Sized to the cores; a tenant with `queue_limit // 4` jobs already waiting, or a
pool with `queue_limit` waiting in all, answers new ones 503 `server_busy` at once instead of
queueing without end."""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from loraplex.platform.errors import HttpError

P = ParamSpec("P")
T = TypeVar("T")
BUSY_RETRY_AFTER_S = 1
TENANT_SHARE = 4  # one tenant may hold 1/TENANT_SHARE of the waiting room


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
    """Run blocking text work in `workers` threads, tenants in turn, at most `queue_limit`
    waiting (and `queue_limit // TENANT_SHARE` of one tenant's)."""

    def __init__(self, workers: int = 0, queue_limit: int = 256) -> None:
        self.workers = workers if workers > 0 else (os.cpu_count() or 1)
        self.queue_limit = queue_limit
        self.tenant_limit = max(1, queue_limit // TENANT_SHARE)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="loraplex-text")
        self._pending = 0
        self._running = 0
        # Waiting jobs: tenant -> its grants in arrival order; the dict's order is the turn.
        self._waiting: OrderedDict[str | None, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished (running or waiting)."""
        return self._pending

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on the pool, for no tenant in particular."""
        return await self.run_for(None, fn, *args, **kwargs)

    async def run_for(
        self, tenant: str | None, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`fn(*args, **kwargs)` on the pool in `tenant`'s turn; raises `busy()` when too many
        already wait (in all, or of this tenant's)."""
        queue = self._waiting.get(tenant)
        waiting = self._pending - self._running
        if waiting >= self.queue_limit or (queue is not None and len(queue) >= self.tenant_limit):
            raise busy()
        self._pending += 1
        granted = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(granted)
        self._grant()
        try:
            await granted
        except BaseException:
            self._pending -= 1
            if granted.done() and not granted.cancelled():
                self._running -= 1  # granted, then cancelled before it ran: free the turn
            else:
                self._forget(tenant, granted)
            self._grant()
            raise
        try:
            return await asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))
        finally:
            self._pending -= 1
            self._running -= 1
            self._grant()

    def _forget(self, tenant: str | None, granted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self._waiting[tenant]

    def _grant(self) -> None:
        """Give free threads to waiting jobs, one tenant after another."""
        while self._running < self.workers and self._waiting:
            tenant, queue = next(iter(self._waiting.items()))
            granted = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)  # its next job waits for the others' turn
            else:
                del self._waiting[tenant]
            if granted.done():  # its caller went away
                continue
            self._running += 1
            granted.set_result(None)

    def close(self) -> None:
        """Stop the threads (work already submitted finishes)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

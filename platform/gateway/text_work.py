"""A bounded pool for the CPU-heavy part of a request (parsing a large JSON body, rendering
the chat template, tokenizing), so the gateway's event loop only waits. Tenants take turns
for its threads: waiting jobs are queued per tenant and a freed thread goes to the next tenant
in round-robin order, so one tenant's queue of long prompts never holds another's request
behind it. Sized to the cores, with at most `queue_limit` jobs waiting: one tenant alone may
fill that room, but when it is full a job of a tenant with fewer waiting takes the place of
the newest job of the tenant with the most (which gets the 503 `server_busy`), so a flood
cannot crowd the others out; a job that finds the room full of its own tenant's (or of as
few as its own) is answered 503 at once instead of queueing without end."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from loraplex.platform.cores import usable_cores
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
    """Run blocking text work in `workers` threads, tenants in turn, at most `queue_limit`
    waiting (the largest tenant's newest job makes way for another tenant's)."""

    def __init__(self, workers: int = 0, queue_limit: int = 256) -> None:
        self.workers = workers if workers > 0 else usable_cores()
        self.queue_limit = queue_limit
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
        if self._pending - self._running >= self.queue_limit:
            self._make_room(tenant)  # raises busy() when this tenant is the one to refuse
        self._pending += 1
        granted = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(granted)
        self._grant()
        try:
            await granted
        except BaseException:
            self._pending -= 1
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self._running -= 1  # granted, then cancelled before it ran: free the turn
            else:  # cancelled while waiting, or refused to make room (already off its queue)
                self._forget(tenant, granted)
            self._grant()
            raise
        try:
            return await asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))
        finally:
            self._pending -= 1
            self._running -= 1
            self._grant()

    def _make_room(self, tenant: str | None) -> None:
        """The room is full: refuse the newest job of the tenant with the most waiting, if it
        has more than `tenant` would after this one; else refuse this one."""
        mine = len(self._waiting.get(tenant, ()))
        hog = max(self._waiting, key=lambda t: len(self._waiting[t]), default=None)
        if hog is None or hog == tenant or len(self._waiting[hog]) <= mine + 1:
            raise busy()
        queue = self._waiting[hog]
        refused = queue.pop()
        if not queue:
            del self._waiting[hog]
        if not refused.done():
            refused.set_exception(busy())

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

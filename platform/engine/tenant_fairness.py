"""Fair admission across tenants: who is admitted next, and how much of a step running
prefills may take while a tenant with nothing running waits.

A request's tenant is its prefix-cache salt (the gateway derives one per tenant) or, on a
deployment that shares its prefix cache, its adapter's tenant; requests with neither form
one group. Waiting requests are ordered by virtual counts: each tenant starts at its number
of running requests and pays one per request placed, the lowest count going next (ties by
arrival), so a tenant with one request is not queued behind another's six hundred, and one
tenant alone is served first come, first served. Preempted requests keep their place at the
head: they were running.

A step is every running request's wait, so while more than one tenant has work its prefill
chunks are sized to keep the step near a target time (`SharedStepBudget`): one tenant's long
prompts in full-budget steps would hold another's first token for two such steps.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterable, Sequence

from loraplex.platform.engine.request import Request, RequestStatus

# At most this share of a step's token budget is held back from running prefill chunks for
# tenants that have nothing running (so a flood of long prompts cannot starve their first).
MAX_RESERVE_SHARE = 0.5


# Prefill tokens a shared step may always take, however slow recent steps were.
MIN_SHARED_PREFILL = 16


def tenant_of(request: Request) -> str | None:
    """The fairness group of `request` (None: no tenant known)."""
    return request.cache_salt or getattr(request.adapter, "tenant", None)


def fair_order(waiting: Iterable[Request], running: Sequence[Request]) -> list[Request]:
    """`waiting` in the order to admit them: preempted ones first, then round-robin over
    tenants, the fewest running first."""
    head: list[Request] = []
    queues: dict[str | None, deque[tuple[int, Request]]] = {}
    for position, request in enumerate(waiting):
        if request.status == RequestStatus.PREEMPTED:
            head.append(request)
            continue
        queues.setdefault(tenant_of(request), deque()).append((position, request))
    count = Counter(tenant_of(r) for r in running)
    heap = [(count[t], q[0][0], i, t) for i, (t, q) in enumerate(queues.items())]
    heapq.heapify(heap)
    order = head
    while heap:
        placed, _, i, tenant = heapq.heappop(heap)
        queue = queues[tenant]
        order.append(queue.popleft()[1])
        if queue:
            heapq.heappush(heap, (placed + 1, queue[0][0], i, tenant))
    return order


def prefill_reserve(
    waiting: Iterable[Request], running: Sequence[Request], budget: int, seats: int
) -> int:
    """Tokens of this step to keep from running prefill chunks: the first prompt of each
    waiting tenant that has nothing running, up to `MAX_RESERVE_SHARE` of `budget`; 0 when
    no seat (`max_num_seqs`) is free or nothing runs."""
    if seats <= 0 or not running:
        return 0
    busy = {tenant_of(r) for r in running}
    demand, seen = 0, set()
    for request in waiting:
        tenant = tenant_of(request)
        if tenant in busy or tenant in seen:
            continue
        seen.add(tenant)
        demand += request.num_tokens - request.num_computed_tokens
        if len(seen) >= seats:
            break
    return min(demand, int(budget * MAX_RESERVE_SHARE))


def shared(waiting: Iterable[Request], running: Iterable[Request]) -> bool:
    """Whether more than one tenant has work (running or waiting)."""
    first: object = _NOBODY
    for request in (*running, *waiting):
        tenant = tenant_of(request)
        if first is _NOBODY:
            first = tenant
        elif tenant != first:
            return True
    return False


_NOBODY = object()


class SharedStepBudget:
    """Tokens a step may hold while tenants share the engine, so that it lasts about
    `target_s`: the target over the measured seconds per token of recent steps with prefill
    work (an average over the step's fixed cost too, so the sizes settle where a step's whole
    time meets the target). 0 turns it off; no cap before a step was measured."""

    SMOOTHING = 0.5

    def __init__(self, target_s: float) -> None:
        self.target_s = target_s
        self.seconds_per_token: float | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        """A step with prefill work ran `tokens` tokens in `seconds`."""
        if tokens <= 0 or seconds <= 0:
            return
        rate = seconds / tokens
        old = self.seconds_per_token
        self.seconds_per_token = rate if old is None else old + self.SMOOTHING * (rate - old)

    def tokens(self, budget: int) -> int:
        """This step's tokens while tenants share (at most `budget`)."""
        if self.target_s <= 0 or not self.seconds_per_token:
            return budget
        return max(MIN_SHARED_PREFILL, min(budget, int(self.target_s / self.seconds_per_token)))


__all__ = [
    "MIN_SHARED_PREFILL",
    "SharedStepBudget",
    "fair_order",
    "prefill_reserve",
    "shared",
    "tenant_of",
]

"""Fair admission across tenants: who is admitted next, and how much of a step running
prefills may take while a tenant with nothing running waits.

A request's tenant is its prefix-cache salt (the gateway derives one per tenant) or, on a
deployment that shares its prefix cache, its adapter's tenant; requests with neither form
one group. Waiting requests are ordered by virtual counts: each tenant starts at its number
of running requests and pays one per request placed, the lowest count going next (ties by
arrival), so a tenant with one request is not queued behind another's six hundred, and one
tenant alone is served first come, first served. Preempted requests keep their place at the
head: they were running.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterable, Sequence

from loraplex.platform.engine.request import Request, RequestStatus

# At most this share of a step's token budget is held back from running prefill chunks for
# tenants that have nothing running (so a flood of long prompts cannot starve their first).
MAX_RESERVE_SHARE = 0.5


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


__all__ = ["fair_order", "prefill_reserve", "tenant_of"]

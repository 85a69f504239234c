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
chunks are sized to add about a target time to the step (`SharedPrefillBudget`): one tenant's
long prompts in full-budget steps would hold another's first token for two such steps.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from itertools import chain

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
    """Whether more than one tenant has work (running or waiting); stops at the second."""
    tenants = (tenant_of(r) for r in chain(running, waiting))
    first = next(tenants, None)
    return any(t != first for t in tenants)


class SharedPrefillBudget:
    """Prefill tokens a step may hold while tenants share the engine, so that the prefill
    chunks add about `target_s` to it: the target over the marginal seconds of a prefill
    token, fitted online over recent steps (step time = fixed + per decode x decodes + per
    prefill token x prefill tokens, recursive least squares with forgetting), so many running
    decodes do not squeeze prefill out. Before the fit has two kinds of steps to tell the
    costs apart, the average seconds per token of recent steps stands in (an overestimate:
    smaller chunks). 0 turns it off; no cap before a step was measured."""

    FORGET = 0.95
    SMOOTHING = 0.5
    P_CAP = 1e6

    def __init__(self, target_s: float) -> None:
        self.target_s = target_s
        self._reset()

    def _reset(self) -> None:
        self.average: float | None = None  # seconds per token, all tokens of a step
        self._theta = [0.0, 0.0, 0.0]
        self._p = [[self.P_CAP if i == j else 0.0 for j in range(3)] for i in range(3)]
        self._fits = 0

    def observe(self, decodes: int, prefill: int, seconds: float) -> None:
        """A step ran `decodes` decode tokens and `prefill` prefill tokens in `seconds`."""
        tokens = decodes + prefill
        if tokens <= 0 or seconds <= 0:
            return
        rate = seconds / tokens
        self.average = rate if self.average is None else (
            self.average + self.SMOOTHING * (rate - self.average)
        )  # fmt: skip
        x = (1.0, float(decodes), float(prefill))
        px = [sum(self._p[i][j] * x[j] for j in range(3)) for i in range(3)]
        gain = [v / (self.FORGET + sum(x[i] * px[i] for i in range(3))) for v in px]
        error = seconds - sum(self._theta[i] * x[i] for i in range(3))
        self._theta = [self._theta[i] + gain[i] * error for i in range(3)]
        self._p = [
            [(self._p[i][j] - gain[i] * px[j]) / self.FORGET for j in range(3)] for i in range(3)
        ]
        self._fits += 1
        # Steps of one kind only (say, decodes for minutes) let the forgetting grow the
        # covariance without bound in the unseen direction: cap it, and start over on nonsense.
        big = max(self._p[i][i] for i in range(3))
        if not all(map(math.isfinite, [*self._theta, big])):
            self._reset()
        elif big > self.P_CAP:
            self._p = [[v * self.P_CAP / big for v in row] for row in self._p]

    def seconds_per_prefill_token(self) -> float | None:
        """The marginal cost of a prefill token (None before any step was measured)."""
        fitted = self._theta[2]
        if self._fits >= 4 and fitted > 0 and self.average is not None:
            return min(fitted, self.average * 4)  # a wild early fit cannot starve prefill
        return self.average

    def tokens(self, budget: int) -> int:
        """This step's prefill tokens while tenants share (at most `budget`)."""
        cost = self.seconds_per_prefill_token()
        if self.target_s <= 0 or not cost:
            return budget
        return max(MIN_SHARED_PREFILL, min(budget, int(self.target_s / cost)))


__all__ = [
    "SharedPrefillBudget",
    "fair_order",
    "prefill_reserve",
    "shared",
    "tenant_of",
]

"""The draft guard: whether drafting pays at this batch size, from what it measured here.

The controller's linear step-cost model decides K per request, but a verification step also
pays costs that model misses (the general forward path, more rows to sample). So per batch-size
bucket (powers of two) the guard keeps the measured seconds per output token of decode steps
that drafted and of steps that did not, and allows drafting only where drafting measured
faster by a margin. It explores the other mode now and then, to keep both figures current:
`explore` steps after a change of mind, then twice as long after each exploration that
confirmed the choice, up to `explore * MAX_BACKOFF` (a drafting step can cost several plain
steps, so exploring at a fixed 1 in `explore` would cost a fixed share of the speed).
"""

from __future__ import annotations

from dataclasses import dataclass

EMA = 0.2  # weight of the newest measurement
EXPLORE_EMA = 0.5  # the same for an exploration's: it is rare, and the figure it updates old
EXPLORE_EVERY = 32
MAX_BACKOFF = 16
MARGIN = 0.95  # drafting must measure at least 5% faster: marginal gains drown in noise
# Below this batch the guard always allows prompt lookup: a step is then mostly its fixed cost,
# which the controller's model holds, and a handful of requests whose acceptance changes by
# phase (a stretch of spurious matches, then a loop) made the per-bucket average switch
# drafting off for whole stretches where it paid (bench spec's batch-1 draft share ranged
# 0.06-0.20 run to run). A draft model is guarded at every size (`min_batch` 1): each of its
# forwards costs about a step, which the controller's model of the target's step cannot see.
MIN_BATCH = 4


@dataclass
class _Bucket:
    interval: int  # steps from one exploration to the next
    since: int = 0  # steps since the last exploration
    chose: bool | None = None  # the choice at the last exploration (None: none yet)
    exploring: bool = False  # the step allowed last runs the mode not chosen
    draft: float | None = None  # seconds per output token, decode steps that drafted
    plain: float | None = None  # the same, decode steps that did not


class DraftGuard:
    """Measured seconds per output token with and without drafts, per batch-size bucket."""

    def __init__(self, explore: int = EXPLORE_EVERY, min_batch: int = MIN_BATCH) -> None:
        self.explore = explore
        self.min_batch = min_batch
        self._buckets: dict[int, _Bucket] = {}

    def allows(self, batch: int) -> bool:
        """Whether a decode step of `batch` sequences may draft (counts it as one step);
        always below `min_batch`."""
        if batch < self.min_batch:
            return True
        b = self._bucket(batch)
        if b.draft is None:
            return True  # measure drafting first
        if b.plain is None:
            return False
        better = b.draft < MARGIN * b.plain
        b.since += 1
        if b.since < b.interval:
            return better
        b.since = 0  # explore the other mode; wait longer next time if the choice held
        confirmed = b.chose == better
        b.interval = min(2 * b.interval, self.explore * MAX_BACKOFF) if confirmed else self.explore
        b.chose = better
        b.exploring = True
        return not better

    def _bucket(self, batch: int) -> _Bucket:
        key = batch.bit_length()
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(interval=self.explore)
        return b

    def record(self, batch: int, drafted: bool, seconds: float, tokens: int) -> None:
        """One decode step's measurement: `tokens` output in `seconds`."""
        if tokens <= 0:
            return
        b = self._bucket(batch)
        per = seconds / tokens
        old = b.draft if drafted else b.plain
        weight = EXPLORE_EMA if b.exploring else EMA
        b.exploring = False
        new = per if old is None else (1 - weight) * old + weight * per
        if drafted:
            b.draft = new
        else:
            b.plain = new

    def seconds_per_token(self, batch: int) -> tuple[float | None, float | None]:
        """(with drafts, without) at this batch size's bucket; None where not measured."""
        b = self._buckets.get(batch.bit_length())
        return (None, None) if b is None else (b.draft, b.plain)

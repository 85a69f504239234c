"""Which deployment of a base model takes a request, when several serve it (a bf16 one and
an int4 tier; an old version and its replacement).

By default traffic follows capacity: the router scores the live replicas of every deployment
alike (more replicas and shorter queues take more). When the operator sets a routing weight
on any of them (`deployments.routing_weight`), each request first draws a deployment with
probability proportional to its weight among those with a live replica (an unset weight
counts 1), takes that deployment's best replica, and keeps the others' replicas, best first,
for failover. Weight 0 is a standby: it serves only while no weighted deployment has a live
replica, which is how a rollout drains an old deployment without a 503.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

# The request header that names a deployment (only one the operator made `nameable`).
DEPLOYMENT_HEADER = "x-loraplex-deployment"
UNSET_WEIGHT = 1.0  # an unset weight among weighted deployments

T = TypeVar("T")


@dataclass(frozen=True)
class DeploymentRoute:
    """One deployment of the base model as the router sees it."""

    name: str
    id: uuid.UUID
    weight: float | None  # None: by capacity
    nameable: bool
    cold_start_wait_s: float
    tool_call_format: str | None = None  # how `auto` tool calls are read; None: the template


def weighted(routes: Sequence[DeploymentRoute]) -> bool:
    """Whether the operator set a weight on any of these deployments."""
    return any(r.weight is not None for r in routes)


def order_by_weight(
    candidates: Sequence[T],
    deployment_of: Callable[[T], str],
    routes: Sequence[DeploymentRoute],
    rng: random.Random,
) -> list[T]:
    """`candidates` (best first) reordered by the operator's weights: the drawn deployment's
    candidates first, then the other weighted ones', standbys (weight 0) last. Unchanged
    when no weight is set."""
    if not weighted(routes):
        return list(candidates)
    weight_of = {r.name: UNSET_WEIGHT if r.weight is None else r.weight for r in routes}
    present = list(dict.fromkeys(deployment_of(c) for c in candidates))
    drawable = [(d, weight_of.get(d, UNSET_WEIGHT)) for d in present]
    drawable = [(d, w) for d, w in drawable if w > 0]
    if not drawable:
        return list(candidates)  # only standbys are live: by capacity among them
    point = rng.random() * sum(w for _, w in drawable)
    chosen = drawable[-1][0]
    for name, w in drawable:
        point -= w
        if point < 0:
            chosen = name
            break

    def rank(c: T) -> int:
        d = deployment_of(c)
        return 0 if d == chosen else (2 if weight_of.get(d, UNSET_WEIGHT) == 0 else 1)

    return sorted(candidates, key=rank)  # stable: best first within each rank


__all__ = [
    "DEPLOYMENT_HEADER",
    "DeploymentRoute",
    "order_by_weight",
    "weighted",
]

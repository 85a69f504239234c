"""Live replicas of a deployment as the console shows them: each one's `/state` (asked with
the replica secret, through the gateway's client) and its cold-start timeline drawn as bars."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from loraplex.platform.gateway.replica_client import ReplicaUnavailable
from loraplex.platform.wire import ReplicaState


@dataclass(frozen=True)
class PhaseBar:
    """One cold-start phase placed on its replica's bar (offset and width in % of the total)."""

    name: str
    start_s: float
    seconds: float
    left_pct: float
    width_pct: float


@dataclass
class ReplicaView:
    """One replica as the console shows it."""

    replica_id: str
    url: str
    state: ReplicaState | None
    error: str = ""

    @property
    def healthy(self) -> bool:
        """Answered /state in the wire format."""
        return self.state is not None

    @property
    def cold_start_seconds(self) -> float:
        """Wall time of the replica's cold start (0 when it does not report one)."""
        return 0.0 if self.state is None else self.state.cold_start_seconds

    @property
    def cold_start(self) -> list[PhaseBar]:
        """The replica's cold-start phases scaled to its wall time (a phase that ran past it,
        e.g. graphs recaptured after an adapter runtime was installed, is clipped at 100%)."""
        if self.state is None or not self.state.cold_start:
            return []
        phases = self.state.cold_start
        total = max(self.state.cold_start_seconds, max(p.start_s + p.seconds for p in phases), 1e-9)
        bars = []
        for p in phases:
            left = min(100.0, 100.0 * p.start_s / total)
            width = min(100.0 - left, 100.0 * p.seconds / total)
            bars.append(PhaseBar(p.name, p.start_s, p.seconds, round(left, 2), round(width, 2)))
        return bars


async def replica_views(request: Request, deployment: str) -> list[ReplicaView] | None:
    """The live replicas of `deployment` with their state; None when this API has no gateway."""
    gw = getattr(request.app.state, "gateway", None)
    return None if gw is None else await views_of(gw, deployment)


async def views_of(gw: Any, deployment: str) -> list[ReplicaView]:
    """The live replicas of `deployment` with their state, asked through gateway `gw`."""
    infos = await gw.registry.live(deployment)

    async def one(info: Any) -> ReplicaView:
        try:
            return ReplicaView(info.replica_id, info.url, await gw.client.state(info.url, 1.0))
        except ReplicaUnavailable as exc:
            return ReplicaView(info.replica_id, info.url, None, str(exc)[:200])

    return list(await asyncio.gather(*(one(i) for i in infos)))

"""The launcher interface: what the control plane asks of wherever engine replicas run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from loraplex.platform.engine_spec.deployment import DeploymentRow

STARTING, READY, STOPPED = "starting", "ready", "stopped"


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica as its launcher sees it: a name, `starting`/`ready`/`stopped`, its URL."""

    name: str
    state: str
    url: str | None = None


@dataclass(frozen=True)
class DeploymentStatus:
    """The replicas a launcher runs for one deployment, and how many it was asked for."""

    deployment: str
    desired: int
    replicas: list[ReplicaStatus] = field(default_factory=list)

    @property
    def ready(self) -> int:
        """Replicas answering their health check."""
        return sum(r.state == READY for r in self.replicas)

    @property
    def starting(self) -> int:
        """Replicas started but not ready yet (cold start)."""
        return sum(r.state == STARTING for r in self.replicas)


@runtime_checkable
class Launcher(Protocol):
    """Starts, scales and stops the engine replicas of deployments; reads their state back.

    `scale(row, n)` makes `n` replicas of the deployment run (starting from none is a start;
    zero stops them all); it returns without waiting for new replicas to be ready (they show
    as `starting`). The engine's options come from the row through
    `engine_spec.engine_args_for_deployment`, whichever launcher runs them."""

    def engine_args(self, deployment: DeploymentRow) -> list[str]:
        """The `loraplex engine` options this launcher runs `deployment` with (no bind address)."""
        ...

    def scale(self, deployment: DeploymentRow, replicas: int) -> None:
        """Run exactly `replicas` replicas of `deployment`."""
        ...

    def stop(self, deployment: str) -> None:
        """Stop every replica of the deployment named `deployment` (drained first)."""
        ...

    def status(self, deployment: str) -> DeploymentStatus:
        """The replicas of `deployment` and their states."""
        ...

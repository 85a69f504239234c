"""The reconcile loop: keep a launcher's replicas matching each deployment's `replicas` row.

An admin creates a deployment (`POST /admin/v1/deployments`) or scales one by changing its
row (`PATCH /admin/v1/deployments/{id}`); every `interval_s` the loop reads the rows it watches
(all of them by default) and asks the launcher for that many replicas; a deployment that is
gone has its replicas stopped. One deployment that cannot be launched (an unservable row) is
logged and skipped; the others go on. Rows are copied into `DeploymentSnapshot`s, so no ORM
object crosses threads or sessions.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import Deployment
from loraplex.platform.launcher.base import Launcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaseModelSnapshot:
    """The base model fields the engine mapping reads."""

    name: str
    object_prefix: str
    config: dict[str, Any] = field(default_factory=dict)  # HF config: pre-quantized schemes


@dataclass(frozen=True)
class DeploymentSnapshot:
    """A deployment row's values at one moment (satisfies `engine_spec.DeploymentRow`)."""

    name: str
    weight_quantization: str
    kv_cache_dtype: str
    max_loras: int
    max_lora_rank: int
    expert_parallel_size: int
    replicas: int
    base_model: BaseModelSnapshot
    deterministic: bool = False
    speculative: dict[str, Any] | None = None


def snapshot(row: Deployment) -> DeploymentSnapshot:
    """Copy what launchers read out of a loaded `Deployment` row."""
    return DeploymentSnapshot(
        name=row.name,
        weight_quantization=row.weight_quantization,
        kv_cache_dtype=row.kv_cache_dtype,
        max_loras=row.max_loras,
        max_lora_rank=row.max_lora_rank,
        expert_parallel_size=row.expert_parallel_size,
        replicas=row.replicas,
        base_model=BaseModelSnapshot(
            row.base_model.name, row.base_model.object_prefix, dict(row.base_model.config or {})
        ),
        deterministic=bool(row.deterministic),
        speculative=None if row.speculative is None else dict(row.speculative),
    )


def load_deployments(
    sessions: sessionmaker[Session], names: list[str] | None = None
) -> dict[str, DeploymentSnapshot]:
    """The deployments named `names` (all when None) as they are now, by name."""
    stmt = select(Deployment)
    if names is not None:
        stmt = stmt.where(Deployment.name.in_(names))
    with sessions() as session:
        return {row.name: snapshot(row) for row in session.scalars(stmt)}


class Reconciler:
    """Every `interval_s`, scale each watched deployment (`deployments`, or every one when
    None) to its row's `replicas`; a deleted one is stopped. Failures are logged and tried
    again on the next pass."""

    def __init__(
        self,
        launcher: Launcher,
        sessions: sessionmaker[Session],
        deployments: list[str] | None = None,
        *,
        interval_s: float = 1.0,
    ) -> None:
        self.launcher = launcher
        self.sessions = sessions
        self.deployments = None if deployments is None else list(deployments)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seen: dict[str, int] = {}

    def once(self) -> None:
        """One pass over the watched deployments."""
        rows = load_deployments(self.sessions, self.deployments)
        for name in [n for n in self.seen if n not in rows]:
            log.info("deployment %s was deleted: stopping its replicas", name)
            self.seen.pop(name)
            self.launcher.stop(name)
        for name, row in sorted(rows.items()):
            if self.seen.get(name) != row.replicas:
                log.info("deployment %s: scaling to %d replica(s)", name, row.replicas)
            try:
                self.launcher.scale(row, row.replicas)
            except Exception:  # noqa: BLE001 - one bad deployment must not stall the others
                log.exception("deployment %s: cannot launch its replicas", name)
                continue
            self.seen[name] = row.replicas

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.once()
            except Exception:  # noqa: BLE001 - keep reconciling; the log says what failed
                log.exception("reconcile pass failed")

    def start(self) -> Reconciler:
        """Reconcile in a background thread until `close()`."""
        self._thread = threading.Thread(target=self._run, name="reconcile", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop reconciling (the replicas keep running; the launcher stops them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

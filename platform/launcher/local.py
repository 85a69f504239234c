"""The local-process launcher (`loraplex up`): each replica is a `loraplex engine` child on a
socket bound here, kept registered for the gateway by a health-gated heartbeat (announced as
starting until its first healthy check), and optionally watched by `up`'s supervisor."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess, http_ok, listen_socket
from loraplex.platform.engine_spec import (
    EngineConfig,
    engine_args,
    engine_config_for_deployment,
    on_a_shared_machine,
)
from loraplex.platform.engine_spec.deployment import DeploymentRow
from loraplex.platform.gateway.replica_agent import register_replica
from loraplex.platform.gateway.replicas import Heartbeat
from loraplex.platform.launcher.base import (
    READY,
    STARTING,
    STOPPED,
    DeploymentStatus,
    ReplicaStatus,
)
from loraplex.platform.local_processes import start_engine_process
from loraplex.platform.settings import Settings
from loraplex.platform.supervisor import Supervised

CHILD_NAME = "engine replica"


@dataclass
class LocalReplica:
    """A running replica: its URL, process, listening socket (kept across restarts, so the
    URL never changes) and its registration heartbeat."""

    name: str
    url: str
    process: ServiceProcess
    socket: socket.socket
    heartbeat: Heartbeat
    config: EngineConfig
    timeout: float = 300

    def restart(self) -> None:
        """Start it again on the same socket; the health-gated heartbeat re-registers it."""
        self.process.start_again()
        self.process.wait_ready(self.healthy, self.timeout)

    def healthy(self) -> bool:
        """Its /health answers 200."""
        try:
            return http_ok(self.url + "/health", timeout=1.0)
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            return False

    def wait_ready(self, timeout: float) -> None:
        """Block until it answers /health (raises with its log if it dies or times out)."""
        self.process.wait_ready(self.healthy, timeout)

    def stop(self, drain_timeout_s: float) -> None:
        """Deregister at once (gateways stop choosing it), then SIGTERM: the server finishes
        its running requests within `drain_timeout_s` and exits."""
        self.heartbeat.stop()
        self.process.stop(signal.SIGTERM, timeout=drain_timeout_s)
        self.socket.close()


def replica_socket(settings: Settings) -> socket.socket:
    """A listening socket for a replica on the internal address (`replica_host`), never the
    API's public `host`: the replica API is for the gateway only."""
    return listen_socket(settings.replica_host, 0)


class LocalLauncher:
    """Engine replicas as processes on this machine (see the module docstring).

    `local_models` maps base model names to local folders (`up`'s copy) served instead of the
    object store; other base models load from the bucket. `watch`/`unwatch` hand each replica
    to a supervisor and take it back."""

    def __init__(
        self,
        settings: Settings,
        logs: Path,
        env: dict[str, str],
        *,
        local_models: dict[str, Path] | None = None,
        watch: Callable[[Supervised], None] | None = None,
        unwatch: Callable[[str], None] | None = None,
        ready_timeout_s: float = 300,
        drain_timeout_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.logs = logs
        self.env = env
        self.local_models = dict(local_models or {})
        self._watch = watch
        self._unwatch = unwatch
        self.ready_timeout_s = ready_timeout_s
        self.drain_timeout_s = (
            settings.drain_timeout_s + 10 if drain_timeout_s is None else drain_timeout_s
        )
        self._replicas: dict[str, list[LocalReplica]] = {}
        self._desired: dict[str, int] = {}
        self._first: str | None = None
        self._lock = threading.Lock()

    def engine_config(self, deployment: DeploymentRow) -> EngineConfig:
        """The deployment's EngineConfig (the one mapping), from a local copy of its base model
        when there is one, else from the bucket."""
        folder = self.local_models.get(deployment.base_model.name)
        if folder is not None:
            config = engine_config_for_deployment(deployment, model=str(folder))
        else:
            config = engine_config_for_deployment(deployment, bucket=self.settings.s3_bucket)
        return on_a_shared_machine(config)  # the API and the services run here too

    def engine_args(self, deployment: DeploymentRow) -> list[str]:
        """The engine options of every replica of `deployment` (before its socket options)."""
        return engine_args(self.engine_config(deployment))

    def _child_name(self, deployment: str, index: int) -> str:
        base = CHILD_NAME if deployment == self._first else f"{CHILD_NAME} ({deployment})"
        return base if index == 0 else f"{base} {index + 1}"

    def scale(self, deployment: DeploymentRow, replicas: int) -> None:
        """Start or stop replicas (newest first) until `replicas` run; new ones start in the
        background and register as starting. Replicas running other engine options than the
        row's now (an edited deployment) are drained and replaced (requests meanwhile wait for
        the new ones, up to the deployment's cold-start bound)."""
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        config = self.engine_config(deployment)  # refuses an unservable row before starting
        with self._lock:
            if self._first is None:
                self._first = deployment.name
            self._desired[deployment.name] = replicas
            running = self._replicas.setdefault(deployment.name, [])
            for stale in [r for r in running if r.config != config]:
                running.remove(stale)
                self._stop_one(stale)
            while len(running) > replicas:
                self._stop_one(running.pop())
            while len(running) < replicas:
                used = {r.name for r in running}
                index = next(i for i in range(len(running) + 1)
                             if self._child_name(deployment.name, i) not in used)  # fmt: skip
                running.append(self._start_one(deployment, config, index))

    def _start_one(
        self, deployment: DeploymentRow, config: EngineConfig, index: int
    ) -> LocalReplica:
        name = self._child_name(deployment.name, index)
        redis_url = self.settings.gateway_redis_url()
        if redis_url is None:
            raise RuntimeError(f"{name} cannot be registered: no Redis URL for the gateway")
        sock = replica_socket(self.settings)
        log = self.logs / ("engine.log" if index == 0 and name == CHILD_NAME
                           else f"engine-{deployment.name}-{index + 1}.log")  # fmt: skip
        try:
            url, proc = start_engine_process(config, log, self.env, sock=sock, timeout=None)
        except BaseException:
            sock.close()
            raise
        try:
            heartbeat = register_replica(
                redis_url, deployment.name, url, model=deployment.base_model.name
            )
        except BaseException:
            proc.stop()
            sock.close()
            raise
        replica = LocalReplica(name, url, proc, sock, heartbeat, config, self.ready_timeout_s)
        if self._watch is not None:
            self._watch(Supervised(name, proc, replica.restart))
        return replica

    def _stop_one(self, replica: LocalReplica) -> None:
        if self._unwatch is not None:
            self._unwatch(replica.name)  # first: the supervisor must not restart it
        replica.stop(self.drain_timeout_s)

    def replicas(self, deployment: str) -> list[LocalReplica]:
        """The replicas running for `deployment` (oldest first)."""
        with self._lock:
            return list(self._replicas.get(deployment, []))

    def wait_ready(self, deployment: str, timeout: float | None = None) -> None:
        """Block until every replica of `deployment` answers /health."""
        for replica in self.replicas(deployment):
            replica.wait_ready(self.ready_timeout_s if timeout is None else timeout)

    def stop(self, deployment: str) -> None:
        """Drain and stop every replica of `deployment`, newest first."""
        with self._lock:
            running = self._replicas.get(deployment, [])
            self._desired[deployment] = 0
            while running:
                self._stop_one(running.pop())

    def stop_all(self) -> None:
        """Stop every deployment's replicas (`up` shutting down); all drain at once."""
        with self._lock:
            everything = [r for reps in self._replicas.values() for r in reps]
            self._replicas.clear()
        for r in everything:
            if self._unwatch is not None:
                self._unwatch(r.name)
            r.heartbeat.stop()
        for r in everything:
            with contextlib.suppress(ProcessLookupError):
                if r.process.running():
                    r.process.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]  # running(): proc is set
        for r in everything:
            r.process.stop(signal.SIGTERM, timeout=self.drain_timeout_s)
            r.socket.close()

    def status(self, deployment: str) -> DeploymentStatus:
        """Each replica: stopped (its process is gone), ready (/health answers) or starting."""
        out = []
        for r in self.replicas(deployment):
            if not r.process.running():
                state = STOPPED
            else:
                state = READY if r.healthy() else STARTING
            out.append(ReplicaStatus(r.name, state, r.url))
        with self._lock:
            desired = self._desired.get(deployment, 0)
        return DeploymentStatus(deployment, desired, out)

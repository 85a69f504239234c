"""The serving part of `loraplex up`: a deployment for the base model, one engine replica
on it, and the replica's registration so the gateway routes requests to it."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess, http_ok, listen_socket
from loraplex.platform.engine_spec import EngineConfig, engine_config_for_deployment
from loraplex.platform.local_processes import start_engine_process
from loraplex.platform.settings import Settings


@dataclass(frozen=True)
class LocalDeployment:
    """The deployment `up` serves: its name and the EngineConfig its replica runs."""

    name: str
    config: EngineConfig


def ensure_deployment(settings: Settings, base_model: str, model_dir: Path) -> LocalDeployment:
    """The base model's first deployment (the one the gateway routes to), made if missing,
    served from the local copy of the model in `model_dir`.

    Raises UnservableDeploymentError, before anything starts, for a deployment the engine
    cannot serve."""
    from sqlalchemy import select

    from loraplex.platform.db.models import Deployment
    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.services.base_models import get_base_model
    from loraplex.platform.services.deployments import DeploymentSpec, create_deployment

    assert settings.database_url is not None
    with session_scope(make_sessionmaker(settings.database_url)) as session:
        base = get_base_model(session, base_model)
        found = session.scalars(
            select(Deployment)
            .where(Deployment.base_model_id == base.id)
            .order_by(Deployment.created_at, Deployment.name)
            .limit(1)
        ).first()
        if found is None:
            # The CPU engine computes in fp32; on a GPU, an admin creates a bf16 one.
            spec = DeploymentSpec(
                name=base_model, base_model=base_model, weight_quantization="fp32"
            )
            found = create_deployment(session, settings, spec, actor="system")
        return LocalDeployment(
            found.name, engine_config_for_deployment(found, model=str(model_dir))
        )


@dataclass
class LocalReplica:
    """A running replica: its URL, process, listening socket (kept across restarts, so the
    URL never changes) and how to deregister it."""

    url: str
    process: ServiceProcess
    socket: socket.socket
    deregister: Callable[[], None]
    timeout: float = 300

    def restart(self) -> None:
        """Start it again on the same socket; the health-gated heartbeat re-registers it."""
        self.process.start_again()
        self.process.wait_ready(lambda: http_ok(self.url + "/health"), self.timeout)


def replica_socket(settings: Settings) -> socket.socket:
    """A listening socket for a replica on the internal address (`replica_host`), never the
    API's public `host`: the replica API is for the gateway only."""
    return listen_socket(settings.replica_host, 0)


def start_replica(
    settings: Settings,
    deployment: LocalDeployment,
    base_model: str,
    log: Path,
    env: dict[str, str],
    timeout: float = 300,
) -> LocalReplica:
    """Start `loraplex engine` for `deployment` on a socket bound here (so a restart keeps its
    URL), wait for /health, and register it for the gateway."""
    from loraplex.platform.gateway.replica_agent import register_replica

    sock = replica_socket(settings)
    try:
        url, proc = start_engine_process(deployment.config, log, env, sock=sock, timeout=timeout)
    except BaseException:
        sock.close()
        raise
    try:
        redis_url = settings.gateway_redis_url()
        if redis_url is None:
            raise proc.fail("cannot be registered: no Redis URL for the gateway")
        heartbeat = register_replica(redis_url, deployment.name, url, model=base_model)
    except BaseException:
        proc.stop()
        sock.close()
        raise
    return LocalReplica(url, proc, sock, heartbeat.stop, timeout)

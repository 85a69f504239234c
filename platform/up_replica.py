"""The serving part of `loraplex up`: a deployment for the base model, one engine replica
on it, and the replica's registration so the gateway routes requests to it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess
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


def start_replica(
    settings: Settings,
    deployment: LocalDeployment,
    base_model: str,
    log: Path,
    env: dict[str, str],
    timeout: float = 300,
) -> tuple[str, ServiceProcess, Callable[[], None]]:
    """Start `loraplex engine` for `deployment`, wait for /health, register it for the gateway.

    Returns the replica URL, its process, and a function that deregisters it."""
    from loraplex.platform.gateway.replica_agent import register_replica

    url, proc = start_engine_process(
        deployment.config, log, env, host=settings.host, timeout=timeout
    )
    try:
        redis_url = settings.gateway_redis_url()
        if redis_url is None:
            raise proc.fail("cannot be registered: no Redis URL for the gateway")
        heartbeat = register_replica(redis_url, deployment.name, url, model=base_model)
    except BaseException:
        proc.stop()
        raise
    return url, proc, heartbeat.stop

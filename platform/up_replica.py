"""The serving part of `loraplex up`: the deployment `up` serves for its base model (made if
missing), whose replicas the local launcher then starts and keeps at the row's count."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loraplex.platform.engine_spec import (
    EngineConfig,
    engine_config_for_deployment,
    on_a_shared_machine,
)
from loraplex.platform.launcher.reconcile import DeploymentSnapshot, snapshot
from loraplex.platform.settings import Settings


@dataclass(frozen=True)
class LocalDeployment:
    """The deployment `up` serves: its name, the EngineConfig its replicas run, and its row."""

    name: str
    config: EngineConfig
    row: DeploymentSnapshot


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
            # The device's native compute type: bf16 where the CPU (AVX512_BF16/AMX) or GPU
            # computes it natively, fp32 elsewhere; the replica reports its choice on /state.
            spec = DeploymentSpec(
                name=base_model, base_model=base_model, weight_quantization="auto"
            )
            found = create_deployment(session, settings, spec, actor="system")
        config = on_a_shared_machine(engine_config_for_deployment(found, model=str(model_dir)))
        return LocalDeployment(found.name, config, snapshot(found))

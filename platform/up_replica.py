"""The serving part of `loraplex up`: a deployment for the base model, one engine replica
on it, and the replica's registration so the gateway routes requests to it."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess, free_port
from loraplex.platform.engine.supported_models import (
    SERVED_WEIGHT_QUANTIZATIONS,
    unserved_quantization_message,
)
from loraplex.platform.settings import Settings


@dataclass(frozen=True)
class LocalDeployment:
    """The deployment `up` serves: its name, and the LoRA limits and weight quantization the
    replica must honour."""

    name: str
    max_loras: int
    max_lora_rank: int
    weight_quantization: str = "fp32"


def ensure_deployment(settings: Settings, base_model: str) -> LocalDeployment:
    """The base model's first deployment (the one the gateway routes to), made if missing."""
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
            found.name, found.max_loras, found.max_lora_rank, found.weight_quantization
        )


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=2) as resp:
        return resp.status == 200


def engine_argv(
    settings: Settings, deployment: LocalDeployment, model_dir: Path, port: int
) -> list[str]:
    """The `loraplex engine` command line serving `deployment` (its limits and quantization).

    Raises UpError, before anything starts, for a quantization the engine does not implement."""
    from loraplex.platform.up import UpError

    quant = deployment.weight_quantization
    if quant not in SERVED_WEIGHT_QUANTIZATIONS:
        raise UpError(
            f"deployment {deployment.name!r}: {unserved_quantization_message(quant)} "
            "(create a deployment with a served quantization)"
        )
    argv = [sys.executable, "-m", "loraplex.platform.cli", "engine", "--model", str(model_dir)]
    argv += ["--host", settings.replica_host, "--port", str(port)]  # internal, not the API's
    argv += ["--max-loras", str(deployment.max_loras)]
    argv += ["--max-lora-rank", str(deployment.max_lora_rank)]
    argv += ["--quantization", quant]
    return argv


def start_replica(
    settings: Settings,
    deployment: LocalDeployment,
    model_dir: Path,
    base_model: str,
    log: Path,
    env: dict[str, str],
    timeout: float = 300,
) -> tuple[str, ServiceProcess, Callable[[], None]]:
    """Start `loraplex engine` on `model_dir`, wait for /health, register it for the gateway.

    Returns the replica URL, its process, and a function that deregisters it."""
    from loraplex.platform.gateway.replica_agent import register_replica

    port = free_port(settings.replica_host)
    url = f"http://{settings.replica_host}:{port}"
    argv = engine_argv(settings, deployment, model_dir, port)
    proc = ServiceProcess("engine", log)
    proc.start(argv, env=env, cwd=log.parent)
    try:
        proc.wait_ready(lambda: _healthy(url), timeout)
        redis_url = settings.gateway_redis_url()
        if redis_url is None:
            raise proc.fail("cannot be registered: no Redis URL for the gateway")
        heartbeat = register_replica(redis_url, deployment.name, url, model=base_model)
    except BaseException:
        proc.stop()
        raise
    return url, proc, heartbeat.stop

"""`up` starts its replica with the deployment's EngineConfig (weight quantization included),
and refuses, before starting anything, a deployment whose quantization cannot serve its base
model (int4 on the demo model, whose intermediate size 688 is not a multiple of 128)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from loraplex.platform.db.migrate import upgrade
from loraplex.platform.db.models import Deployment
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine_spec import (
    ServerOptions,
    UnservableDeploymentError,
    parse_engine_args,
)
from loraplex.platform.local_processes import engine_argv
from loraplex.platform.services.base_models import get_base_model, register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.up_replica import ensure_deployment


def test_replica_gets_the_deployment_quantization(
    settings, pg_fresh_url: str, tmp_path: Path
) -> None:
    upgrade(pg_fresh_url)
    s = settings.model_copy(update={"database_url": pg_fresh_url})
    folder = make_demo_model(tmp_path / "demo")
    register_base_model(s, "qdemo", folder)
    with session_scope(make_sessionmaker(pg_fresh_url)) as session:
        spec = DeploymentSpec(name="qdemo-bf16", base_model="qdemo", weight_quantization="bf16")
        create_deployment(session, s, spec)
    dep = ensure_deployment(s, "qdemo", folder)
    assert dep.name == "qdemo-bf16" and dep.config.quantization == "bf16"
    argv = engine_argv(dep.config, ServerOptions(port=8123))
    assert argv[argv.index("--quantization") + 1] == "bf16"
    config, server = parse_engine_args(argv[argv.index("engine") + 1 :])
    assert config == dep.config and server.port == 8123  # the engine's own parser reads it
    assert config.model == str(folder) and config.model_id == "qdemo"


@pytest.mark.parametrize("quant", ["int4"])
def test_unserved_quantization_fails_before_starting(
    settings, pg_fresh_url: str, tmp_path: Path, quant: str
) -> None:
    upgrade(pg_fresh_url)
    s = settings.model_copy(update={"database_url": pg_fresh_url})
    folder = make_demo_model(tmp_path / "demo")
    register_base_model(s, "old", folder)
    with session_scope(make_sessionmaker(pg_fresh_url)) as session:  # a row from before
        base = get_base_model(session, "old")
        session.add(
            Deployment(
                id=uuid.uuid4(), name="old-dep", base_model_id=base.id,
                weight_quantization=quant, kv_cache_dtype="auto", max_loras=4,
                max_lora_rank=16, replicas=1, expert_parallel_size=1,
            )
        )  # fmt: skip
    with pytest.raises(
        UnservableDeploymentError, match="intermediate_size=688 is not a multiple of 128"
    ):
        ensure_deployment(s, "old", folder)

"""`up` starts its replica with the deployment's weight quantization (`--quantization`), and
refuses, before starting anything, a deployment whose quantization the engine does not serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.platform.db.migrate import upgrade
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine.server import build_parser, config_from_args
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.up import UpError
from loraplex.platform.up_replica import (
    LocalDeployment,
    engine_argv,
    ensure_deployment,
    start_replica,
)


def _engine_config(argv: list[str]):
    rest = argv[argv.index("engine") + 1 :]
    return config_from_args(build_parser().parse_args(rest))


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
    dep = ensure_deployment(s, "qdemo")
    assert dep.name == "qdemo-bf16" and dep.weight_quantization == "bf16"
    argv = engine_argv(s, dep, folder, 8123)
    assert argv[argv.index("--quantization") + 1] == "bf16"
    assert _engine_config(argv).quantization == "bf16"  # the engine's own parser reads it


@pytest.mark.parametrize("quant", ["int8", "fp8", "int4"])
def test_unserved_quantization_fails_before_starting(settings, tmp_path: Path, quant: str) -> None:
    dep = LocalDeployment("old-dep", 4, 16, quant)
    log = tmp_path / "engine.log"
    with pytest.raises(UpError, match=f"'{quant}' is not implemented by the engine"):
        start_replica(settings, dep, tmp_path, "m", log, env={})
    assert not log.exists()  # nothing was started

"""Schemathesis over the live API's OpenAPI document (admin, tenant and OpenAI-compatible
routes), authenticated, every phase including the stateful one (links: created tenant -> its
keys, upload -> adapter, version and completion): no 5xx, every 4xx an OpenAI error object,
every answer matching its declared schema. The stack is real: the API under uvicorn, an
engine replica serving the demo model, PostgreSQL, S3 and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.control_plane import fresh_database
from support.gateway_stack import Api, Replica, settings_env

from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.services.api_keys import create_api_key
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.services.tenants import create_tenant

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
# At least 50 examples per operation in every phase (LORAPLEX_FUZZ_EXAMPLES raises it, e.g.
# 500 for a long run), more scenarios and steps for the stateful phase, which follows links.
EXAMPLES = max(50, int(os.environ.get("LORAPLEX_FUZZ_EXAMPLES", "50")))
CONFIG = f"""
[generation]
max-examples = {EXAMPLES}

[phases.stateful]
max-steps = 10

[phases.stateful.generation]
max-examples = 20
"""
CHECKS = (
    "not_a_server_error,response_schema_conformance,content_type_conformance,openai_error_shape"
)


@pytest.fixture(scope="module")
def live(pg_url: str, settings: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("fuzz")
    db_url = fresh_database(pg_url, "fuzz")
    tag = uuid.uuid4().hex[:8]
    s = settings.model_copy(
        update={"database_url": db_url, "data_dir": work / "data", "rate_limit_rpm": 100_000}
    )
    model_dir = make_demo_model(work / "demo")
    base, dep = f"demo-{tag}", f"demo-dep-{tag}"
    register_base_model(s, base, model_dir)
    with session_scope(make_sessionmaker(db_url)) as session:
        create_deployment(
            session,
            s,
            DeploymentSpec(name=dep, base_model=base, weight_quantization="fp32", max_loras=2),
        )
        tenant = create_tenant(session, f"fuzz-{tag}")
        _, key = create_api_key(session, tenant.id, "fuzz")
    replica = Replica(model_dir, dep, redis_url, work, env=settings_env(s, "engine"))
    api = Api(settings_env(s), work)
    try:
        yield {"url": api.url, "admin_key": s.admin_key, "tenant_key": key, "model": base}
    finally:
        api.stop()
        replica.stop()


def test_openapi_documents_every_route_with_models_and_links(live: dict[str, Any]) -> None:
    doc = httpx.get(f"{live['url']}/openapi.json", timeout=30).json()
    ops = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
    for name, op in ops.items():
        ok = next(v for k, v in op["responses"].items() if k.startswith("2"))
        assert "content" in ok or name == "healthz", f"{name} declares no response body"
        if name != "healthz":
            assert op["responses"]["404"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorResponse"
            }
    for name in ("chat_completions", "completions", "adapter_chat_completions", "upload_adapter"):
        assert ops[name]["requestBody"]["required"] is True, name
    links = ops["create_tenant"]["responses"]["201"]["links"]
    assert links["CreateApiKey"]["operationId"] == "create_api_key"
    assert "CompleteUpload" in ops["start_upload"]["responses"]["201"]["links"]


def test_schemathesis_finds_no_5xx_and_only_openai_shaped_errors(
    live: dict[str, Any], tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": str(REPO / "tests" / "support" / "fuzz_hooks.py"),
        "LORAPLEX_FUZZ_ADMIN_KEY": live["admin_key"],
        "LORAPLEX_FUZZ_TENANT_KEY": live["tenant_key"],
        "LORAPLEX_FUZZ_MODEL": live["model"],
    }
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    cmd = [
        str(Path(sys.executable).with_name("st")),
        "--config-file", str(config),
        "run",
        f"{live['url']}/openapi.json",
        "--checks", CHECKS,
        "--phases", "examples,coverage,fuzzing,stateful",
        "--seed", "13",
        "--workers", "1",
        "--request-timeout", "60",
        "--suppress-health-check", "all",
        "--no-color",
    ]  # fmt: skip
    out = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=360, check=False
    )
    report = out.stdout[-8000:] + out.stderr[-2000:]
    print(report)
    assert out.returncode == 0, report
    assert "No issues found" in out.stdout or " passed" in out.stdout, report

"""A deployment's defaults have one owner (issue 28: "deployment defaults in the API schema,
the service and the database"): `engine_spec.deployment.DEPLOYMENT_DEFAULTS`. The API schema,
the service's spec and the ORM model's server defaults read it; none writes the value itself.
Alembic revisions keep the values of their day and are not read here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# field -> the name the API schema gives it (inside `Quantization` for the two choices)
FIELDS = {
    "weight_quantization": "weights",
    "kv_cache_dtype": "kv_cache",
    "replicas": "replicas",
    "expert_parallel_size": "expert_parallel_size",
    "share_prefix_cache": "share_prefix_cache",
    "cold_start_wait_s": "cold_start_wait_s",
    "deterministic": "deterministic",
    "nameable": "nameable",
}


def _class(rel: str, name: str) -> ast.ClassDef:
    tree = ast.parse((REPO / rel).read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _default(value: ast.expr | None) -> ast.expr | None:
    """A field's default expression (`= X`, `Field(default=X)`, `Field(X)`)."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Field":
        for kw in value.keywords:
            if kw.arg == "default":
                return kw.value
        return value.args[0] if value.args else None
    return value


def _literal_defaults(rel: str, cls: str, names: set[str]) -> dict[str, object]:
    out = {}
    for node in _class(rel, cls).body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        found = _default(node.value)
        if node.target.id in names and isinstance(found, ast.Constant):
            out[node.target.id] = found.value
    return out


def test_no_module_but_the_owner_writes_a_deployment_default() -> None:
    api_names = set(FIELDS.values())
    written = {
        "api/schemas.py DeploymentCreate": _literal_defaults(
            "api/schemas.py", "DeploymentCreate", api_names
        ),
        "api/schemas.py Quantization": _literal_defaults(
            "api/schemas.py", "Quantization", api_names
        ),
        "services DeploymentSpec": _literal_defaults(
            "platform/services/deployments.py", "DeploymentSpec", set(FIELDS)
        ),
    }
    server = {}
    for node in _class("platform/db/models.py", "Deployment").body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if node.target.id in FIELDS and isinstance(node.value, ast.Call):
            for kw in node.value.keywords:
                if kw.arg == "server_default" and isinstance(kw.value, ast.Constant):
                    server[node.target.id] = kw.value.value
    written["db Deployment server_default"] = server
    assert {k: v for k, v in written.items() if v} == {}


def test_every_layer_gets_the_owner_values() -> None:
    from loraplex.api.schemas import DeploymentCreate, Quantization
    from loraplex.platform.db.models import Deployment
    from loraplex.platform.engine_spec.deployment import DEPLOYMENT_DEFAULTS, sql_default
    from loraplex.platform.services.deployments import DeploymentSpec

    spec = DeploymentSpec(name="d", base_model="b")
    body = DeploymentCreate(name="d", base_model="b")
    q = Quantization()
    columns = Deployment.__table__.columns
    for field, api_name in FIELDS.items():
        want = getattr(DEPLOYMENT_DEFAULTS, field)
        assert getattr(spec, field) == want, field
        assert getattr(q if api_name in ("weights", "kv_cache") else body, api_name) == want
        server = columns[field].server_default
        if server is not None:
            assert str(server.arg) == sql_default(want), field

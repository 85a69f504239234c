"""A request may name the deployment that serves it, where the operator allows it (issue 21,
item 9): two deployments of one base model, each with a replica; the
`X-Loraplex-Deployment` header sends a request to the named one only, and usage is metered
to it; a deployment not made nameable answers 403, one that does not serve the model 404.
The admin PATCH sets `nameable` and `routing_weight` (refusing bad values by name). The API
runs under uvicorn in its own process over real PostgreSQL, S3 and Redis; scripted replicas
(real HTTP servers) stand in for the engines."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from support.control_plane import control_plane
from support.gateway_catalog import make_model_dir, seed_catalog
from support.gateway_stack import Api, settings_env
from support.scripted_replica import ScriptedReplica, register_url

from loraplex.platform.db.models import Deployment, UsageRecord
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services.api_keys import create_api_key
from loraplex.platform.services.tenants import create_tenant

pytestmark = pytest.mark.timeout(240)
HEADER = "X-Loraplex-Deployment"


def test_a_request_names_its_deployment_where_allowed(
    pg_url: str,
    settings: Any,
    s3_client: Any,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    work = tmp_path_factory.mktemp("named")
    with control_plane(pg_url, settings, s3_client, "named") as cp:
        base = f"named-{uuid.uuid4().hex[:8]}"
        for f in make_model_dir(work / base).iterdir():
            s3_client.put_object(
                Bucket=cp.s3_bucket, Key=f"models/{base}/{f.name}", Body=f.read_bytes()
            )
        factory = make_sessionmaker(cp.database_url)
        with session_scope(factory) as session:
            base_row, old = seed_catalog(session, base)
            new = Deployment(
                id=uuid.uuid4(), name=f"{base}-bf16", base_model_id=base_row.id,
                weight_quantization="bf16", kv_cache_dtype="auto", max_loras=4, max_lora_rank=16,
                replicas=1, expert_parallel_size=1, nameable=True,
                created_at=datetime.now(UTC) + timedelta(seconds=1),
            )  # fmt: skip
            session.add(new)
            old_name, old_id, new_name, new_id = old.name, old.id, new.name, new.id
            tenant = create_tenant(session, f"namer-{uuid.uuid4().hex[:6]}")
            tenant_id = tenant.id
            _, key = create_api_key(session, tenant.id, "k")
        with ScriptedReplica([5]) as on_old, ScriptedReplica([6]) as on_new:
            register_url(redis_url, old_name, on_old.url)
            register_url(redis_url, new_name, on_new.url)
            api = Api(settings_env(cp, usage_flush_interval_s=0.2), work)
            try:
                _check_named(api.url, key, base, cp, (old_id, old_name, new_name), on_old, on_new)
            finally:
                api.stop()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with factory() as session:
                metered = session.scalars(
                    select(UsageRecord.deployment_id).where(UsageRecord.tenant_id == tenant_id)
                ).all()
            if len(metered) >= 4:
                break
            time.sleep(0.2)
        assert metered.count(new_id) == 3 and metered.count(old_id) == 1, metered


def _check_named(url, key, model, cp, deployments, on_old, on_new) -> None:  # noqa: ANN001
    old_id, old_name, new_name = deployments
    auth = {"Authorization": f"Bearer {key}"}
    admin = {"Authorization": f"Bearer {cp.admin_key}"}
    body = {"model": model, "prompt": "hello", "max_tokens": 1}

    def complete(name: str | None) -> httpx.Response:
        headers = {**auth, **({HEADER: name} if name is not None else {})}
        return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)

    for _ in range(3):
        assert complete(new_name).status_code == 200
    assert len(on_new.requests) == 3 and not on_old.requests

    refused = complete(old_name)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "deployment_not_nameable"
    unknown = complete("not-a-deployment-of-this-model")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "deployment_not_found"
    assert not on_old.requests  # refusals reach no replica

    patch = f"{url}/admin/v1/deployments/{old_id}"
    for bad, param in (({"routing_weight": -1}, "routing_weight"), ({"nameable": None}, "nameable"),
                       ({}, None)):  # fmt: skip
        r = httpx.patch(patch, json=bad, headers=admin, timeout=10)
        assert r.status_code in (400, 422), (bad, r.text)
        assert r.json()["error"]["param"] == param or param is None, r.text
    r = httpx.patch(patch, json={"nameable": True, "routing_weight": 0}, headers=admin, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["nameable"] is True and r.json()["routing_weight"] == 0.0
    deadline = time.monotonic() + 10  # resolutions are cached for up to 2 s
    while complete(old_name).status_code == 403 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert len(on_old.requests) == 1

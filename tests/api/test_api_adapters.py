"""Tenant adapter API end to end: upload -> real Celery validation -> ready, versions,
presigned multipart uploads, delete (objects removed by the job), tenant isolation,
idempotency and concurrent uploads."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from support.control_plane import tenant_keys
from support.uploads import adapter_files, upload, wait_for_version
from support.waiting import wait_until


def test_upload_validates_to_ready_and_versions_increment(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    tenant_id, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    resp = upload(client, headers, "support-bot", base_model, config, weights)
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["name"] == "support-bot" and body["version"] == 1
    assert body["status"] == "validating"
    v1 = wait_for_version(client, headers, "support-bot", 1)
    assert v1["status"] == "ready", v1
    assert v1["error"] is None
    assert v1["sha256"] == hashlib.sha256(weights).hexdigest()
    assert v1["config_sha256"] == hashlib.sha256(config).hexdigest()
    assert v1["bytes"] == len(weights)
    assert v1["rank"] == 4 and v1["alpha"] == 8.0 and v1["use_rslora"] is False
    assert v1["target_modules"] == ["q_proj", "v_proj"]
    keys = set(tenant_keys(s3_client, cp_settings.s3_bucket, tenant_id))
    prefix = f"tenants/{tenant_id}/adapters/{body['id']}/v1/"
    assert keys == {prefix + "adapter_config.json", prefix + "adapter_model.safetensors"}

    resp = upload(client, headers, "support-bot", base_model, config, weights)
    assert resp.status_code == 202 and resp.json()["version"] == 2
    assert wait_for_version(client, headers, "support-bot", 2)["status"] == "ready"

    got = client.get("/v1/adapters/support-bot", headers=headers).json()
    assert got["version"] == 2 and got["status"] == "ready" and got["base_model"] == base_model
    listed = client.get("/v1/adapters", headers=headers).json()
    assert [a["name"] for a in listed["data"]] == ["support-bot"]
    assert client.get("/v1/adapters/support-bot/versions/3", headers=headers).status_code == 404
    assert client.get("/v1/adapters/nope", headers=headers).status_code == 404


def test_rslora_all_linear_adapter_is_accepted_under_the_limit(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    tiny_llama: Path,
    tmp_path: Path,
) -> None:
    from support.peft_adapters import peft_adapter_dir

    _, headers = make_tenant()
    adir = peft_adapter_dir(
        tiny_llama, tmp_path / "a", r=8, alpha=4, targets="all-linear", use_rslora=True
    )
    config, weights = adapter_files(adir)
    assert upload(client, headers, "all", base_model, config, weights).status_code == 202
    v = wait_for_version(client, headers, "all", 1)
    assert v["status"] == "ready", v
    assert v["rank"] == 8 and v["use_rslora"] is True
    assert v["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


def test_tenants_are_isolated(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    owner_id, owner = make_tenant()
    _, other = make_tenant()
    config, weights = adapter_files(adapter_r4)
    assert upload(client, owner, "private", base_model, config, weights).status_code == 202
    assert wait_for_version(client, owner, "private", 1)["status"] == "ready"
    assert client.get("/v1/adapters", headers=other).json()["data"] == []
    for path in ("/v1/adapters/private", "/v1/adapters/private/versions/1"):
        resp = client.get(path, headers=other)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "adapter_not_found"
    resp = client.delete("/v1/adapters/private", headers=other)
    assert resp.status_code == 404
    # The owner's real presigned upload: the other tenant can neither see nor complete it,
    # even under an adapter name of its own that matches.
    started = client.post(
        "/v1/adapters/private/uploads",
        headers=owner,
        json={"base_model": base_model, "adapter_config": json.loads(config), "size": len(weights)},
    )
    assert started.status_code == 201, started.text
    plan = started.json()
    put = httpx.put(plan["parts"][0]["url"], content=weights, timeout=30)
    assert put.status_code == 200
    parts = {"parts": [{"part_number": 1, "etag": put.headers["ETag"]}]}
    complete = f"/v1/adapters/private/uploads/{plan['upload_id']}/complete"
    assert client.post(complete, headers=other, json=parts).status_code == 404
    own = client.post(
        "/v1/adapters/private/uploads",
        headers=other,
        json={"base_model": base_model, "adapter_config": json.loads(config), "size": len(weights)},
    )
    assert own.status_code == 201  # `other` now has an upload named "private" too
    resp = client.post(complete, headers=other, json=parts)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "upload_not_found"
    assert (
        client.get("/v1/adapters/private/versions/2", headers=owner).json()["status"] == "uploading"
    )
    # the owner's ready version is untouched; the other tenant's name is its own
    assert client.get("/v1/adapters/private/versions/1", headers=owner).json()["status"] == "ready"
    assert tenant_keys(s3_client, cp_settings.s3_bucket, owner_id)
    assert upload(client, other, "private", base_model, config, weights).status_code == 202
    assert client.get("/v1/adapters/private", headers=owner).json()["version"] == 2


def test_delete_removes_rows_now_and_objects_by_job(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    tenant_id, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    for _ in range(2):
        assert upload(client, headers, "gone", base_model, config, weights).status_code == 202
    wait_for_version(client, headers, "gone", 2)
    assert len(tenant_keys(s3_client, cp_settings.s3_bucket, tenant_id)) == 4
    resp = client.delete("/v1/adapters/gone", headers=headers)
    assert resp.status_code == 202, resp.text
    assert resp.json()["deleted"] is True
    assert client.get("/v1/adapters/gone", headers=headers).status_code == 404
    assert client.delete("/v1/adapters/gone", headers=headers).status_code == 404
    wait_until(
        lambda: not tenant_keys(s3_client, cp_settings.s3_bucket, tenant_id),
        timeout=30,
        what="the deletion job to remove the objects",
    )
    from sqlalchemy import select

    from loraplex.platform.db.models import AuditLog
    from loraplex.platform.db.session import make_sessionmaker

    with make_sessionmaker(cp_settings.database_url)() as s:
        actions = s.scalars(
            select(AuditLog.action).where(AuditLog.tenant_id == uuid.UUID(tenant_id))
        ).all()
    assert actions.count("adapter_version.upload") == 2 and "adapter.delete" in actions
    # a new adapter under the same name starts again at version 1
    assert upload(client, headers, "gone", base_model, config, weights).json()["version"] == 1


def test_presigned_multipart_upload(
    client: TestClient, worker, base_model: str, deployment: dict, make_tenant, adapter_r4: Path
) -> None:
    import json

    _, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    resp = client.post(
        "/v1/adapters/big/uploads",
        headers=headers,
        json={"base_model": base_model, "adapter_config": json.loads(config), "size": len(weights)},
    )
    assert resp.status_code == 201, resp.text
    plan = resp.json()
    assert plan["status"] == "uploading" and plan["version"] == 1
    assert len(plan["parts"]) == 1 and plan["part_size"] >= len(weights)
    put = httpx.put(plan["parts"][0]["url"], content=weights, timeout=30)
    assert put.status_code == 200, put.text
    etag = put.headers["ETag"]
    assert client.get("/v1/adapters/big", headers=headers).json()["status"] == "uploading"
    done = client.post(
        f"/v1/adapters/big/uploads/{plan['upload_id']}/complete",
        headers=headers,
        json={"parts": [{"part_number": 1, "etag": etag}]},
    )
    assert done.status_code == 202, done.text
    v = wait_for_version(client, headers, "big", 1)
    assert v["status"] == "ready" and v["sha256"] == hashlib.sha256(weights).hexdigest()
    again = client.post(
        f"/v1/adapters/big/uploads/{plan['upload_id']}/complete",
        headers=headers,
        json={"parts": [{"part_number": 1, "etag": etag}]},
    )
    assert again.status_code == 202 and again.json()["status"] == "ready"


def test_idempotent_upload(
    client: TestClient, worker, base_model: str, deployment: dict, make_tenant, adapter_r4: Path
) -> None:
    _, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    key = {"Idempotency-Key": "upload-1"}
    first = upload(client, headers, "idem", base_model, config, weights, extra=key)
    again = upload(client, headers, "idem", base_model, config, weights, extra=key)
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json()
    other = upload(client, headers, "idem", base_model, config, weights + b"x", extra=key)
    assert other.status_code == 422
    wait_for_version(client, headers, "idem", 1)
    assert client.get("/v1/adapters/idem", headers=headers).json()["version"] == 1


def test_concurrent_uploads_get_distinct_versions(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
) -> None:
    _, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    results: list[int] = []
    errors: list[str] = []

    def go() -> None:
        resp = upload(client, headers, "race", base_model, config, weights)
        if resp.status_code == 202:
            results.append(resp.json()["version"])
        else:
            errors.append(resp.text)

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(results) == [1, 2, 3, 4, 5, 6]
    for n in range(1, 7):
        assert wait_for_version(client, headers, "race", n)["status"] == "ready"

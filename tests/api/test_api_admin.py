"""Admin API, health and the error contract, against real PostgreSQL."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient


def _is_openai_error(body: dict) -> bool:
    err = body.get("error")
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}


def test_healthz(client: TestClient) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok"}


def test_unknown_route_is_openai_shaped_404(client: TestClient) -> None:
    resp = client.get("/nope")
    assert resp.status_code == 404
    assert _is_openai_error(resp.json())


def test_admin_auth_is_required(client: TestClient, make_tenant) -> None:
    resp = client.get("/admin/v1/tenants")
    assert resp.status_code == 401 and _is_openai_error(resp.json())
    assert resp.json()["error"]["type"] == "authentication_error"
    resp = client.get("/admin/v1/tenants", headers={"Authorization": "Bearer wrong"})
    assert resp.status_code == 401
    _, tenant_headers = make_tenant()
    assert client.get("/admin/v1/tenants", headers=tenant_headers).status_code == 401


def test_tenants_create_list_get(client: TestClient, admin_headers: dict) -> None:
    name = f"acme-{uuid.uuid4().hex[:6]}"
    resp = client.post("/admin/v1/tenants", headers=admin_headers, json={"name": name})
    assert resp.status_code == 201, resp.text
    tenant = resp.json()
    assert tenant["name"] == name and uuid.UUID(tenant["id"])
    listed = client.get("/admin/v1/tenants", headers=admin_headers).json()
    assert listed["object"] == "list" and tenant["id"] in {t["id"] for t in listed["data"]}
    got = client.get(f"/admin/v1/tenants/{tenant['id']}", headers=admin_headers)
    assert got.status_code == 200 and got.json()["name"] == name
    dup = client.post("/admin/v1/tenants", headers=admin_headers, json={"name": name})
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "tenant_exists"
    assert client.get(f"/admin/v1/tenants/{uuid.uuid4()}", headers=admin_headers).status_code == 404
    assert client.get("/admin/v1/tenants/not-a-uuid", headers=admin_headers).status_code == 404


def test_tenant_body_validation(client: TestClient, admin_headers: dict) -> None:
    resp = client.post("/admin/v1/tenants", headers=admin_headers, json={})
    assert resp.status_code == 422 and _is_openai_error(resp.json())
    assert resp.json()["error"]["param"] == "name"
    resp = client.post("/admin/v1/tenants", headers=admin_headers, json={"name": "../x"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_name"
    resp = client.post(
        "/admin/v1/tenants",
        headers=admin_headers,
        content=b"{not json",
    )
    assert resp.status_code == 422 and _is_openai_error(resp.json())


def test_api_keys_create_list_revoke(client: TestClient, admin_headers: dict, make_tenant) -> None:
    tenant_id, _ = make_tenant()
    resp = client.post(
        f"/admin/v1/tenants/{tenant_id}/api-keys", headers=admin_headers, json={"name": "ci"}
    )
    assert resp.status_code == 201, resp.text
    key = resp.json()
    assert key["key"].startswith("lp_") and key["key"].startswith(key["prefix"])
    headers = {"Authorization": f"Bearer {key['key']}"}
    assert client.get("/v1/adapters", headers=headers).status_code == 200
    listed = client.get(f"/admin/v1/tenants/{tenant_id}/api-keys", headers=admin_headers).json()
    mine = [k for k in listed["data"] if k["id"] == key["id"]]
    assert mine and "key" not in mine[0] and mine[0]["last_used_at"] is not None
    revoked = client.delete(f"/admin/v1/api-keys/{key['id']}", headers=admin_headers)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    resp = client.get("/v1/adapters", headers=headers)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    assert (
        client.delete(f"/admin/v1/api-keys/{uuid.uuid4()}", headers=admin_headers).status_code
        == 404
    )
    unknown = client.post(
        f"/admin/v1/tenants/{uuid.uuid4()}/api-keys", headers=admin_headers, json={"name": "x"}
    )
    assert unknown.status_code == 404


def test_tenant_routes_need_a_key(client: TestClient) -> None:
    assert client.get("/v1/adapters").status_code == 401
    resp = client.get("/v1/adapters", headers={"Authorization": "Bearer lp_madeup"})
    assert resp.status_code == 401 and _is_openai_error(resp.json())


def test_deployments(
    client: TestClient, admin_headers: dict, deployment: dict, base_model: str
) -> None:
    assert deployment["quantization"] == {"weights": "bf16", "kv_cache": "auto"}
    assert deployment["max_lora_rank"] == 8 and deployment["base_model"] == base_model
    listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
    assert deployment["id"] in {d["id"] for d in listed}
    # The deterministic mode is a deployment option: stored and shown; a configuration it does
    # not cover (an fp8 KV cache) is refused at creation, naming what.
    det = {"name": "det-dep", "base_model": base_model, "deterministic": True,
           "quantization": {"weights": "fp32"}}  # fmt: skip
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=det)
    assert resp.status_code == 201, resp.text
    assert resp.json()["deterministic"] is True and deployment["deterministic"] is False
    bad = {**det, "name": "det-kv8", "quantization": {"weights": "int8", "kv_cache": "fp8"}}
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=bad)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "deterministic"
    assert "kv_cache_dtype fp8" in resp.json()["error"]["message"]
    # Without a choice: `auto`, the device's native compute type (stored, shown, served).
    plain = {"name": "auto-dep", "base_model": base_model}
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=plain)
    assert resp.status_code == 201, resp.text
    assert resp.json()["quantization"] == {"weights": "auto", "kv_cache": "auto"}
    # Quantized choices are stored and shown; one that cannot serve this base model (int4:
    # the tiny model's hidden size 64 is not a multiple of the group size 128) is refused at
    # creation, saying why and what would work.
    for weights, kv in (("int8", "auto"), ("fp8", "fp8")):
        body = {"name": f"{weights}-dep", "base_model": base_model,
                "quantization": {"weights": weights, "kv_cache": kv}}  # fmt: skip
        resp = client.post("/admin/v1/deployments", headers=admin_headers, json=body)
        assert resp.status_code == 201, resp.text
        assert resp.json()["quantization"] == {"weights": weights, "kv_cache": kv}
    for weights in ("int4", "int4_sym"):
        int4 = {"name": f"{weights}-dep", "base_model": base_model,
                "quantization": {"weights": weights}}  # fmt: skip
        resp = client.post("/admin/v1/deployments", headers=admin_headers, json=int4)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == "quantization.weights"
        assert err["code"] == "unsupported_quantization"
        assert "multiple of 128" in err["message"] and "int8 or fp8 would work" in err["message"]
        listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
        assert f"{weights}-dep" not in {d["name"] for d in listed}  # nothing half-written
    body = {
        "name": "fp16-dep",
        "base_model": base_model,
        "quantization": {"weights": "fp16", "kv_cache": "auto"},
        "replicas": 2,
    }
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=body)
    assert resp.status_code == 201, resp.text
    assert resp.json()["quantization"] == {"weights": "fp16", "kv_cache": "auto"}
    assert resp.json()["max_lora_rank"] == 64  # Settings.default_max_lora_rank
    assert client.post("/admin/v1/deployments", headers=admin_headers, json=body).status_code == 409
    bad_q = {**body, "name": "bad", "quantization": {"weights": "int3"}}
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=bad_q)
    assert resp.status_code == 422 and resp.json()["error"]["param"] == "quantization.weights"
    no_base = {**body, "name": "nobase", "base_model": "missing"}
    assert (
        client.post("/admin/v1/deployments", headers=admin_headers, json=no_base).status_code == 404
    )
    ep_dense = {**body, "name": "ep", "expert_parallel_size": 2}
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=ep_dense)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "expert_parallel_size"
    models = client.get("/admin/v1/base-models", headers=admin_headers).json()["data"]
    assert {"name": base_model, "family": "dense"}.items() <= models[0].items()


def test_idempotency_key_on_admin_posts(client: TestClient, admin_headers: dict) -> None:
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    name = f"idem-{uuid.uuid4().hex[:6]}"
    first = client.post("/admin/v1/tenants", headers={**admin_headers, **key}, json={"name": name})
    again = client.post("/admin/v1/tenants", headers={**admin_headers, **key}, json={"name": name})
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    other = client.post(
        "/admin/v1/tenants", headers={**admin_headers, **key}, json={"name": name + "x"}
    )
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    names = [
        t["name"] for t in client.get("/admin/v1/tenants", headers=admin_headers).json()["data"]
    ]
    assert names.count(name) == 1 and name + "x" not in names
    # a failed request frees its key: the same key may then be used successfully
    key2 = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    dup = client.post("/admin/v1/tenants", headers={**admin_headers, **key2}, json={"name": name})
    assert dup.status_code == 409
    ok = client.post("/admin/v1/tenants", headers={**admin_headers, **key2}, json={"name": name})
    assert ok.status_code == 409  # same request, same (fresh) outcome: not a stored replay
    assert ok.headers.get("Idempotent-Replayed") is None


def test_api_key_replay_never_shows_the_secret_twice(
    client: TestClient, admin_headers: dict, make_tenant
) -> None:
    tenant_id, _ = make_tenant()
    hdrs = {**admin_headers, "Idempotency-Key": f"k-{uuid.uuid4()}"}
    url = f"/admin/v1/tenants/{tenant_id}/api-keys"
    first = client.post(url, headers=hdrs, json={"name": "once"})
    again = client.post(url, headers=hdrs, json={"name": "once"})
    assert first.json()["key"].startswith("lp_")
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert again.json()["key"] is None


def test_idempotency_key_in_flight_is_409(cp_settings) -> None:
    import pytest

    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.services import idempotency
    from loraplex.platform.services.errors import Conflict, Unprocessable

    sessions = make_sessionmaker(cp_settings.database_url)
    key, fp = f"k-{uuid.uuid4()}", idempotency.fingerprint("POST", "/x", {"a": 1})
    assert idempotency.begin(sessions, "admin", key, fp) is None  # claimed, still running
    with pytest.raises(Conflict):
        idempotency.begin(sessions, "admin", key, fp)
    with pytest.raises(Unprocessable):
        idempotency.begin(sessions, "admin", key, idempotency.fingerprint("POST", "/x", {}))
    idempotency.complete(sessions, "admin", key, 201, {"id": "1"})
    stored = idempotency.begin(sessions, "admin", key, fp)
    assert stored is not None and (stored.status, stored.body) == (201, {"id": "1"})
    # the same key in another caller's scope is independent
    assert idempotency.begin(sessions, "tenant:x", key, fp) is None


def test_unhandled_errors_are_openai_shaped_500(cp_settings) -> None:
    from loraplex.api.app import create_app

    app = create_app(cp_settings)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("kaboom")

    with TestClient(app, raise_server_exceptions=False) as c:
        resp = c.get("/boom")
    assert resp.status_code == 500 and _is_openai_error(resp.json())
    assert "kaboom" not in resp.text and resp.json()["error"]["type"] == "server_error"


def test_admin_body_over_limit_is_413(client: TestClient, admin_headers: dict) -> None:
    resp = client.post(
        "/admin/v1/tenants",
        headers={**admin_headers, "Content-Type": "application/json"},
        content=b'{"name": "' + b"x" * (2 << 20) + b'"}',
    )
    assert resp.status_code == 413 and _is_openai_error(resp.json())


def test_factory_mode_reads_settings_from_env(cp_settings, monkeypatch) -> None:
    """`uvicorn --factory loraplex.api.app:create_app` builds Settings from LORAPLEX_* vars."""
    from loraplex.api.app import create_app

    monkeypatch.setenv("LORAPLEX_DATABASE_URL", cp_settings.database_url)
    monkeypatch.setenv("LORAPLEX_BROKER_URL", cp_settings.broker_url)
    monkeypatch.setenv("LORAPLEX_ADMIN_KEY", "env-admin-key")
    with TestClient(create_app()) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        resp = c.get("/admin/v1/tenants", headers={"Authorization": "Bearer env-admin-key"})
        assert resp.status_code == 200
    monkeypatch.delenv("LORAPLEX_DATABASE_URL")
    with TestClient(create_app()) as c:
        resp = c.get("/healthz")
        assert resp.status_code == 503 and _is_openai_error(resp.json())

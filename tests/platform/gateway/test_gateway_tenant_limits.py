"""Per-tenant rate limits and monthly token quotas through the real app: admin API sets them
(POST/PATCH), the gateway applies them in Redis, `/v1/limits` reports them. Real PostgreSQL,
S3 and Redis; a scripted replica (a real HTTP server) stands in for the engine."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis.asyncio import Redis
from support.control_plane import control_plane
from support.gateway_catalog import make_model_dir, seed_catalog
from support.scripted_replica import ScriptedReplica

DEFAULT_RPM = 7
REPLY_TOKENS = [5, 6, 7]


@pytest.fixture(scope="module")
def stack(
    pg_url: str,
    settings: Any,
    s3_client: Any,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """The app over a fresh database and bucket, one base model served by a scripted replica."""
    from loraplex.api.app import create_app
    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry

    with control_plane(pg_url, settings, s3_client, "gwlimits", rate_limit_rpm=DEFAULT_RPM) as cp:
        base_name = f"lim-{uuid.uuid4().hex[:8]}"
        folder = make_model_dir(tmp_path_factory.mktemp("tok") / base_name)
        for f in folder.iterdir():
            s3_client.put_object(
                Bucket=cp.s3_bucket, Key=f"models/{base_name}/{f.name}", Body=f.read_bytes()
            )
        with make_sessionmaker(cp.database_url)() as session, session.begin():
            _, dep = seed_catalog(session, base_name)
            dep_name = dep.name

        async def register(url: str) -> None:
            redis = Redis.from_url(redis_url)
            try:
                await ReplicaRegistry(redis).register(ReplicaInfo(dep_name, url), ttl_s=600)
            finally:
                await redis.aclose()

        with ScriptedReplica(REPLY_TOKENS) as replica:
            asyncio.run(register(replica.url))
            app = create_app(cp)
            with TestClient(app, raise_server_exceptions=False) as client:
                yield {
                    "client": client,
                    "admin": {"Authorization": f"Bearer {cp.admin_key}"},
                    "model": base_name,
                }


def _tenant(stack: dict[str, Any], **limits: Any) -> tuple[str, dict[str, str], dict]:
    client, admin = stack["client"], stack["admin"]
    name = f"t-{uuid.uuid4().hex[:10]}"
    t = client.post("/admin/v1/tenants", headers=admin, json={"name": name, **limits})
    assert t.status_code == 201, t.text
    k = client.post(
        f"/admin/v1/tenants/{t.json()['id']}/api-keys", headers=admin, json={"name": "k"}
    )
    assert k.status_code == 201, k.text
    return t.json()["id"], {"Authorization": f"Bearer {k.json()['key']}"}, t.json()


def _chat(stack: dict[str, Any], headers: dict[str, str], max_tokens: int = 3) -> Any:
    body = {
        "model": stack["model"],
        "messages": [{"role": "user", "content": "Hello world"}],
        "max_tokens": max_tokens,
    }
    return stack["client"].post("/v1/chat/completions", headers=headers, json=body)


def _fresh_window() -> None:
    """Start a burst early in a one-minute window so it cannot straddle two windows."""
    into = time.time() % 60
    if into > 45:
        time.sleep(60.5 - into)


def _is_openai_error(resp: Any, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def test_tenants_get_their_own_rpm_headers_and_429s(stack: dict[str, Any]) -> None:
    _, a_key, a_view = _tenant(stack, requests_per_minute=2)
    _, b_key, _ = _tenant(stack, requests_per_minute=3, tokens_per_minute=50_000)
    _, d_key, d_view = _tenant(stack)  # no own limits: the Settings defaults
    assert a_view["limits"]["requests_per_minute"] == 2
    assert d_view["limits"] == {
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "monthly_token_quota": None,
        "max_concurrent_uploads": None,
        "max_stored_adapter_bytes": None,
    }
    _fresh_window()
    for headers, rpm in ((a_key, 2), (b_key, 3)):
        for i in range(rpm):
            ok = _chat(stack, headers)
            assert ok.status_code == 200, ok.text
            assert ok.headers["x-ratelimit-limit-requests"] == str(rpm)
            assert ok.headers["x-ratelimit-remaining-requests"] == str(rpm - i - 1)
        refused = _chat(stack, headers)
        _is_openai_error(refused, 429, "rate_limit_exceeded")
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert refused.headers["x-ratelimit-limit-requests"] == str(rpm)
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    d = _chat(stack, d_key)
    assert d.status_code == 200, d.text
    assert d.headers["x-ratelimit-limit-requests"] == str(DEFAULT_RPM)
    assert _chat(stack, b_key).headers["x-ratelimit-limit-tokens"] == "50000"


def test_patch_changes_a_limit_at_once(stack: dict[str, Any]) -> None:
    client, admin = stack["client"], stack["admin"]
    tid, key, _ = _tenant(stack, requests_per_minute=1)
    _fresh_window()
    assert _chat(stack, key).status_code == 200
    _is_openai_error(_chat(stack, key), 429, "rate_limit_exceeded")
    resp = client.patch(f"/admin/v1/tenants/{tid}", headers=admin, json={"requests_per_minute": 4})
    assert resp.status_code == 200, resp.text
    assert resp.json()["limits"]["requests_per_minute"] == 4
    assert client.get(f"/admin/v1/tenants/{tid}", headers=admin).json()["limits"] == {
        "requests_per_minute": 4,
        "tokens_per_minute": None,
        "monthly_token_quota": None,
        "max_concurrent_uploads": None,
        "max_stored_adapter_bytes": None,
    }
    ok = _chat(stack, key)  # the same minute: 1 of 4 used before, now 2
    assert ok.status_code == 200, ok.text
    assert ok.headers["x-ratelimit-limit-requests"] == "4"
    assert ok.headers["x-ratelimit-remaining-requests"] == "2"
    back = client.patch(
        f"/admin/v1/tenants/{tid}", headers=admin, json={"requests_per_minute": None}
    )
    assert back.json()["limits"]["requests_per_minute"] is None  # the default again
    limits = client.get("/v1/limits", headers=key).json()
    assert limits["requests_per_minute"]["limit"] == DEFAULT_RPM


def _limits_when(client: TestClient, key: dict[str, str], used: int) -> dict:
    """`/v1/limits` once the quota counter reads `used` (settlement runs after the reply)."""
    deadline = time.monotonic() + 5
    while True:
        limits = client.get("/v1/limits", headers=key).json()
        if limits["monthly_tokens"]["used"] == used or time.monotonic() > deadline:
            return limits
        time.sleep(0.05)


def test_monthly_quota_is_settled_reported_and_enforced(stack: dict[str, Any]) -> None:
    client, admin = stack["client"], stack["admin"]
    tid, key, view = _tenant(stack, monthly_token_quota=100_000)
    assert view["limits"]["monthly_token_quota"] == 100_000
    first = _chat(stack, key, max_tokens=40)  # reserves prompt + 40, uses prompt + 3
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    assert usage["completion_tokens"] == len(REPLY_TOKENS)
    spent = usage["total_tokens"]
    limits = _limits_when(client, key, spent)
    assert limits["monthly_tokens"] == {
        "quota": 100_000,
        "used": spent,
        "remaining": 100_000 - spent,
        "resets_at": limits["monthly_tokens"]["resets_at"],
    }
    assert limits["requests_per_minute"]["limit"] == DEFAULT_RPM

    # Room for the prompt but not for max_tokens: refused before it runs, nothing charged.
    quota = spent + usage["prompt_tokens"] + 5
    client.patch(f"/admin/v1/tenants/{tid}", headers=admin, json={"monthly_token_quota": quota})
    short = _chat(stack, key, max_tokens=10)
    err = _is_openai_error(short, 429, "insufficient_quota")
    assert err["type"] == "insufficient_quota" and "Lower max_tokens" in err["message"]
    assert short.headers["x-should-retry"] == "false"
    assert int(short.headers["retry-after"]) >= 1

    second = _chat(stack, key, max_tokens=3)
    assert second.status_code == 200, second.text
    used = spent + second.json()["usage"]["total_tokens"]
    assert _limits_when(client, key, used)["monthly_tokens"]["remaining"] == quota - used

    client.patch(f"/admin/v1/tenants/{tid}", headers=admin, json={"monthly_token_quota": used})
    err = _is_openai_error(_chat(stack, key), 429, "insufficient_quota")
    assert "exceeded your monthly token quota" in err["message"]
    assert client.get("/v1/limits", headers=key).json()["monthly_tokens"]["remaining"] == 0


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"requests_per_minute": 0}, 400, "requests_per_minute"),
        ({"tokens_per_minute": -5}, 400, "tokens_per_minute"),
        ({"monthly_token_quota": 2**63}, 400, "monthly_token_quota"),
        ({}, 400, None),
        ({"requests_per_minute": "ten"}, 422, "requests_per_minute"),
        ({"requests_per_minute": 1.5}, 422, "requests_per_minute"),
        ({"tokens_per_minute": True}, 422, "tokens_per_minute"),
        ({"name": "renamed"}, 422, "name"),
    ],
)
def test_bad_patch_bodies_get_openai_errors(
    stack: dict[str, Any], body: dict, status: int, param: str | None
) -> None:
    client, admin = stack["client"], stack["admin"]
    tid, _, _ = _tenant(stack, requests_per_minute=9)
    err = _is_openai_error(
        client.patch(f"/admin/v1/tenants/{tid}", headers=admin, json=body), status
    )
    assert err["param"] == param
    assert (
        client.get(f"/admin/v1/tenants/{tid}", headers=admin).json()["limits"][
            "requests_per_minute"
        ]
        == 9
    )


def test_bad_create_limits_and_unknown_tenants(stack: dict[str, Any]) -> None:
    client, admin = stack["client"], stack["admin"]
    bad = client.post(
        "/admin/v1/tenants", headers=admin, json={"name": "neg", "monthly_token_quota": -1}
    )
    assert _is_openai_error(bad, 400)["param"] == "monthly_token_quota"
    for tid in (str(uuid.uuid4()), "not-a-uuid"):
        resp = client.patch(
            f"/admin/v1/tenants/{tid}", headers=admin, json={"tokens_per_minute": 5}
        )
        _is_openai_error(resp, 404, "tenant_not_found")


def test_tenant_keys_cannot_use_admin_routes(stack: dict[str, Any]) -> None:
    client = stack["client"]
    tid, key, _ = _tenant(stack, requests_per_minute=2)
    other, _, _ = _tenant(stack)
    for target in (tid, other):
        resp = client.patch(
            f"/admin/v1/tenants/{target}", headers=key, json={"requests_per_minute": 10_000}
        )
        assert resp.status_code in (401, 403) and "error" in resp.json()
    resp = client.post("/admin/v1/tenants", headers=key, json={"name": "sneaky"})
    assert resp.status_code in (401, 403)
    _is_openai_error(client.patch(f"/admin/v1/tenants/{tid}", json={}), 401)
    assert client.get("/v1/limits", headers=key).json()["requests_per_minute"]["limit"] == 2


def test_limits_need_a_valid_key(stack: dict[str, Any]) -> None:
    _is_openai_error(stack["client"].get("/v1/limits"), 401, "invalid_api_key")
    resp = stack["client"].get("/v1/limits", headers={"Authorization": "Bearer lp-nope"})
    _is_openai_error(resp, 401, "invalid_api_key")

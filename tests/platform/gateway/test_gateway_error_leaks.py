"""Tenants see a message and a request id, never internals (issue 13, item 7): replica URLs,
replica and engine exception text, and storage errors go to the log under the request id that
every response carries in `x-request-id`. Real app, PostgreSQL, S3 and Redis; scripted replicas
(real HTTP servers) fail on cue."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis.asyncio import Redis
from support.control_plane import control_plane
from support.gateway_catalog import make_model_dir, seed_catalog
from support.scripted_replica import ScriptedReplica

from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry


@pytest.fixture(scope="module")
def stack(
    pg_url: str,
    settings: Any,
    s3_client: Any,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """The app over a fresh database and bucket; deployments made on demand by `deployment`."""
    from loraplex.api.app import create_app
    from loraplex.platform.db.session import make_sessionmaker

    with control_plane(pg_url, settings, s3_client, "gwleaks") as cp:
        folder = make_model_dir(tmp_path_factory.mktemp("tok"))
        sessions = make_sessionmaker(cp.database_url)

        def deployment(with_files: bool = True) -> tuple[str, str]:
            base = f"leak-{uuid.uuid4().hex[:8]}"
            if with_files:
                for f in folder.iterdir():
                    s3_client.put_object(
                        Bucket=cp.s3_bucket, Key=f"models/{base}/{f.name}", Body=f.read_bytes()
                    )
            with sessions() as session, session.begin():
                _, dep = seed_catalog(session, base)
                return base, dep.name

        with TestClient(create_app(cp), raise_server_exceptions=False) as client:
            admin = {"Authorization": f"Bearer {cp.admin_key}"}
            t = client.post("/admin/v1/tenants", headers=admin, json={"name": "leaky"}).json()
            key = client.post(
                f"/admin/v1/tenants/{t['id']}/api-keys", headers=admin, json={"name": "k"}
            ).json()["key"]
            yield {
                "client": client,
                "auth": {"Authorization": f"Bearer {key}"},
                "deployment": deployment,
                "redis_url": redis_url,
            }


@contextmanager
def registered(stack: dict[str, Any], deployment: str, *urls: str) -> Iterator[None]:
    infos = [ReplicaInfo(deployment, url) for url in urls]

    async def run(add: bool) -> None:
        redis = Redis.from_url(stack["redis_url"])
        try:
            for info in infos:
                reg = ReplicaRegistry(redis)
                await (reg.register(info, ttl_s=600) if add else reg.remove(info))
        finally:
            await redis.aclose()

    asyncio.run(run(True))
    try:
        yield
    finally:
        asyncio.run(run(False))


def _chat(stack: dict[str, Any], model: str, **extra: Any) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return stack["client"].post(
        "/v1/chat/completions", headers=stack["auth"], json={**body, **extra}
    )


def _no_internals(text: str, *secrets: str) -> None:
    for secret in ("127.0.0.1", "Traceback", *secrets):
        assert secret not in text, f"{secret!r} leaked: {text}"


def test_replica_failure_is_a_503_naming_the_request_not_the_replica(
    stack: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    base, dep = stack["deployment"]()
    with ScriptedReplica([1, 2], fail="before") as broken, registered(stack, dep, broken.url):
        resp = _chat(stack, base)
    assert resp.status_code == 503, resp.text
    rid = resp.headers["x-request-id"]
    err = resp.json()["error"]
    assert err["code"] == "no_replica_available" and rid in err["message"]
    _no_internals(resp.text, str(broken.port), "engine crashed", "answered 500")
    assert rid in caplog.text and str(broken.port) in caplog.text  # the details: in the log


def test_replica_lost_mid_stream_is_a_generic_error_event(
    stack: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    base, dep = stack["deployment"]()
    with ScriptedReplica([1, 2, 3, 4], fail="after") as flaky, registered(stack, dep, flaky.url):
        streamed = _chat(stack, base, stream=True)
    base, dep = stack["deployment"]()  # a fresh deployment: the router benched that replica
    with ScriptedReplica([1, 2, 3, 4], fail="after") as flaky2, registered(stack, dep, flaky2.url):
        whole = _chat(stack, base)
    assert streamed.status_code == 200
    rid = streamed.headers["x-request-id"]
    frames = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: {")]
    err = json.loads(frames[-1])["error"]
    assert err["code"] == "replica_lost" and rid in err["message"]
    _no_internals(streamed.text, str(flaky.port), "RemoteProtocolError", "incomplete")
    assert whole.status_code == 502 and whole.json()["error"]["code"] == "replica_lost"
    assert whole.headers["x-request-id"] in whole.json()["error"]["message"]
    _no_internals(whole.text, str(flaky2.port))
    assert str(flaky.port) in caplog.text


def test_unexpected_failure_is_a_generic_500_with_the_request_id(
    stack: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = stack["deployment"](with_files=False)  # no tokenizer in object storage
    resp = _chat(stack, base)
    assert resp.status_code == 500, resp.text
    rid = resp.headers["x-request-id"]
    err = resp.json()["error"]
    assert err["code"] == "internal_error" and rid in err["message"]
    _no_internals(resp.text, "tokenizer.json", "TokenizerNotFound", base)
    assert rid in caplog.text and "tokenizer.json" in caplog.text


def test_every_answer_carries_a_request_id(stack: dict[str, Any]) -> None:
    client = stack["client"]
    answers = [
        client.get("/v1/models", headers=stack["auth"]),
        client.get("/v1/models"),
        client.get("/no/such/route"),
        client.post("/v1/chat/completions", headers=stack["auth"], content=b"{nope"),
        client.get("/healthz"),
    ]
    ids = [r.headers.get("x-request-id") for r in answers]
    assert [r.status_code for r in answers] == [200, 401, 404, 400, 200]
    assert all(ids) and len(set(ids)) == len(ids)

"""The request log keeps what an operator needs to find a reported request: the adapter and
version it asked for, the deployment and replica that served it, and errors that reached the
tenant inside a stream answered 200 (an error event after the first byte). Real app,
PostgreSQL, S3 and Redis; scripted replicas (real HTTP servers) fail on cue."""

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
from support.console import make_operator, sign_in
from support.control_plane import control_plane
from support.gateway_catalog import add_adapter_version, make_model_dir, seed_catalog
from support.scripted_replica import ScriptedReplica
from support.waiting import wait_until

from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def stack(
    pg_url: str, settings: Any, s3_client: Any, redis_url: str, tmp_path_factory: Any
) -> Iterator[dict[str, Any]]:
    """The app over a fresh database and bucket, one tenant with a key, an operator signed in;
    `adapter()` makes a base model, its deployment and a ready adapter version of the tenant."""
    from loraplex.api.app import create_app
    from loraplex.platform.db.session import make_sessionmaker

    with control_plane(pg_url, settings, s3_client, "reqlog") as cp:
        folder = make_model_dir(tmp_path_factory.mktemp("tok"))
        sessions = make_sessionmaker(cp.database_url)
        make_operator(cp.database_url, "reqlog@example.com", "viewer")
        with TestClient(create_app(cp), raise_server_exceptions=False) as client:
            admin = {"Authorization": f"Bearer {cp.admin_key}"}
            t = client.post("/admin/v1/tenants", headers=admin, json={"name": "reqlog"}).json()
            key = client.post(
                f"/admin/v1/tenants/{t['id']}/api-keys", headers=admin, json={"name": "k"}
            ).json()["key"]

            def adapter() -> dict[str, Any]:
                base = f"rl-{uuid.uuid4().hex[:8]}"
                for f in folder.iterdir():
                    s3_client.put_object(
                        Bucket=cp.s3_bucket, Key=f"models/{base}/{f.name}", Body=f.read_bytes()
                    )
                with sessions() as session, session.begin():
                    base_row, dep = seed_catalog(session, base)
                    add_adapter_version(session, uuid.UUID(t["id"]), base_row, f"{base}-bot")
                    _, v2 = add_adapter_version(session, uuid.UUID(t["id"]), base_row,
                                                f"{base}-bot")  # fmt: skip
                    return {"name": f"{base}-bot", "version": v2.n, "deployment": dep.name}

            assert sign_in(client, "reqlog@example.com").status_code == 303
            yield {
                "client": client,
                "auth": {"Authorization": f"Bearer {key}"},
                "adapter": adapter,
                "redis_url": redis_url,
                "sessions": sessions,
            }


@contextmanager
def registered(stack: dict[str, Any], info: ReplicaInfo) -> Iterator[None]:
    async def run(add: bool) -> None:
        redis = Redis.from_url(stack["redis_url"])
        try:
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


def _logged(stack: dict[str, Any], rid: str) -> Any:
    from loraplex.platform.services import request_log

    def find() -> Any:
        with stack["sessions"]() as session:
            return request_log.find(session, rid)

    return wait_until(find, timeout=20, what=f"{rid} in the request log")


def test_an_error_inside_a_200_stream_is_logged_with_adapter_version_and_replica(
    stack: dict[str, Any],
) -> None:
    a = stack["adapter"]()
    with ScriptedReplica([1, 2, 3, 4], fail="after") as flaky:
        info = ReplicaInfo(a["deployment"], flaky.url)
        with registered(stack, info):
            r = _chat(stack, a["name"], stream=True)
    assert r.status_code == 200
    frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: {")]
    assert json.loads(frames[-1])["error"]["code"] == "replica_lost"  # what the tenant saw
    rid = r.headers["x-request-id"]
    e = _logged(stack, rid)["RequestLog"]
    assert (e.status, e.in_stream, e.code) == (200, True, "replica_lost")
    want = (a["name"], a["version"], a["deployment"])
    assert (e.adapter, e.adapter_version, e.deployment) == want
    assert e.replica == info.replica_id
    assert str(flaky.port) in (e.detail or "")  # the internals the tenant was not shown
    page = stack["client"].get("/console/requests", params={"id": rid}).text
    for shown in (a["name"], f"v{a['version']}", info.replica_id, a["deployment"], "replica_lost",
                  "inside the stream", str(flaky.port)):  # fmt: skip
        assert shown in page, shown


def test_a_refusal_after_routing_names_the_replica_and_version(stack: dict[str, Any]) -> None:
    a = stack["adapter"]()
    with ScriptedReplica([1, 2], fail="before") as broken:
        info = ReplicaInfo(a["deployment"], broken.url)
        with registered(stack, info):
            r = _chat(stack, a["name"])
    assert r.status_code == 503, r.text
    e = _logged(stack, r.headers["x-request-id"])["RequestLog"]
    assert (e.status, e.in_stream, e.code) == (503, False, "no_replica_available")
    assert (e.adapter, e.adapter_version, e.replica) == (a["name"], a["version"], info.replica_id)


def test_a_refusal_before_dispatch_names_the_adapter_version(stack: dict[str, Any]) -> None:
    """Refused after resolution but before any replica (here: more tokens asked than the
    context holds): the entry still names the adapter and version the model resolved to."""
    a = stack["adapter"]()
    r = _chat(stack, a["name"], max_tokens=10_000_000)
    assert r.status_code == 400, r.text
    e = _logged(stack, r.headers["x-request-id"])["RequestLog"]
    assert (e.adapter, e.adapter_version, e.replica) == (a["name"], a["version"], None)


def test_a_stream_that_ends_well_is_not_logged(stack: dict[str, Any]) -> None:
    from loraplex.platform.services import request_log

    a = stack["adapter"]()
    with (
        ScriptedReplica([1, 2, 3]) as fine,
        registered(stack, ReplicaInfo(a["deployment"], fine.url)),
    ):
        r = _chat(stack, a["name"], stream=True)
        refused = _chat(stack, "nope")
    assert r.status_code == 200 and r.text.rstrip().endswith("[DONE]")
    _logged(stack, refused.headers["x-request-id"])  # a later request: written by now
    with stack["sessions"]() as session:
        assert request_log.find(session, r.headers["x-request-id"]) is None


def test_a_burst_of_refusals_is_written_in_a_few_transactions(stack: dict[str, Any]) -> None:
    """A flood of refused requests must not cost a database transaction each (the writes
    run on the API's shared threads): entries that arrive together are written together.
    Each row's `xmin` names the transaction that inserted it."""
    from sqlalchemy import text

    rids = [_chat(stack, "no-such-model").headers["x-request-id"] for _ in range(40)]
    _logged(stack, rids[-1])
    with stack["sessions"]() as session:
        rows = session.execute(
            text("SELECT request_id, xmin::text FROM request_log WHERE request_id = ANY(:ids)"),
            {"ids": rids},
        ).all()
    assert len(rows) == len(rids)  # every refusal is logged
    transactions = {xmin for _, xmin in rows}
    assert len(transactions) <= 4, f"{len(rids)} refusals took {len(transactions)} transactions"


def test_a_nul_in_a_refused_path_loses_no_entry_of_its_burst(stack: dict[str, Any]) -> None:
    """A refusal whose path holds a NUL (which PostgreSQL text refuses) is written like any
    other, and so is the rest of the burst it arrives in."""
    client, auth = stack["client"], stack["auth"]
    nul = client.get("/v1/adapters/a%00b", headers=auth)
    assert nul.status_code == 400
    other = _chat(stack, "no-such-model")
    assert _logged(stack, other.headers["x-request-id"]) is not None
    path = _logged(stack, nul.headers["x-request-id"])["RequestLog"].path
    assert path == "/v1/adapters/a\ufffdb"


def test_refusals_queued_at_shutdown_are_written(
    pg_url: str, settings: Any, s3_client: Any, tmp_path_factory: Any
) -> None:
    """Entries wait a moment to be written together; an API stopping meanwhile writes them
    before it reports it has stopped."""
    from loraplex.api.app import create_app
    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.services import request_log

    with control_plane(pg_url, settings, s3_client, "reqlog-stop") as cp:
        with TestClient(create_app(cp), raise_server_exceptions=False) as client:
            r = client.post(
                "/v1/completions", headers={"Authorization": "Bearer nope"}, json={"model": "m"}
            )
        assert r.status_code == 401
        with make_sessionmaker(cp.database_url)() as session:
            assert request_log.find(session, r.headers["x-request-id"]) is not None

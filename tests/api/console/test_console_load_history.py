"""A deployment's load over time is kept by the API, not by the browser: the API samples its
replicas' `/state` (through its own gateway) while no page is open, keeps a bounded history,
and the deployment page charts that history. Scripted replicas (real HTTP servers speaking the
wire format) report the load; the app's lifespan starts the gateway and the sampler."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis.asyncio import Redis
from support.console import make_operator, sign_in
from support.gateway_catalog import seed_catalog
from support.scripted_replica import ScriptedReplica, replica_state
from support.waiting import wait_until

from loraplex.api.console import load_history
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry

pytestmark = pytest.mark.timeout(120)


@contextmanager
def registered(redis_url: str, info: ReplicaInfo) -> Iterator[None]:
    async def run(add: bool) -> None:
        redis = Redis.from_url(redis_url)
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


def test_the_api_keeps_each_deployments_load_over_time(
    console_app: Any, console_settings: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load_history, "SAMPLE_EVERY_S", 0.2)
    with session_scope(make_sessionmaker(console_settings.database_url)) as s:
        _, dep = seed_catalog(s, f"hist-{uuid.uuid4().hex[:8]}")
        dep_id, name = dep.id, dep.name
    make_operator(console_settings.database_url, "history@example.com", "viewer")
    busy = replica_state(kv_cache_usage=0.5, num_requests_waiting=3, num_requests_running=2,
                         resident_adapters=["a", "b"], max_loras=4)  # fmt: skip
    with (
        ScriptedReplica([1], state=busy) as replica,
        registered(redis_url, ReplicaInfo(name, replica.url)),
        TestClient(console_app, raise_server_exceptions=False) as client,  # lifespan: sampler
    ):
        # Nobody has the page open: the API samples on its own.
        wait_until(lambda: replica.state_calls >= 3, timeout=30, what="the API sampling /state")
        replica.state_doc = replica_state(kv_cache_usage=0.25, num_requests_waiting=0,
                                          num_requests_running=1, resident_adapters=["a"],
                                          max_loras=4)  # fmt: skip
        calls = replica.state_calls
        wait_until(lambda: replica.state_calls >= calls + 3, timeout=30, what="more samples")
        assert sign_in(client, "history@example.com").status_code == 303
        r = client.get(f"/console/api/deployments/{dep_id}/load")
        assert r.status_code == 200, r.text
        body = r.json()
        page = client.get(f"/console/deployments/{dep_id}").text
    console_app.state.gateway = None  # closed with its event loop
    s = body["series"]
    assert len(s["t"]) >= 5 and s["t"] == sorted(s["t"])
    assert (s["kv_pct"][0], s["waiting"][0], s["running"][0], s["resident"][0]) == (50.0, 3, 2, 2)
    assert (s["kv_pct"][-1], s["waiting"][-1], s["running"][-1], s["resident"][-1]) == (
        25.0,
        0,
        1,
        1,
    )
    assert set(s["replicas"]) == {1}
    assert body["every_s"] == 0.2 and body["units"]["kv_pct"] == "%"
    assert f'data-load-history="/console/api/deployments/{dep_id}/load"' in page
    assert "data-live-state" not in page  # the browser no longer keeps the history


def test_the_history_is_bounded() -> None:
    history = load_history.LoadHistory(keep=10)
    for i in range(25):
        history.add("d", load_history.Sample(t=i, replicas=1, kv_pct=0.0, waiting=i, running=0,
                                             resident=0))  # fmt: skip
    series = history.series("d")
    assert series["t"] == list(range(15, 25)) and series["waiting"][-1] == 24
    assert history.series("unknown")["t"] == []
    history.keep_only({"other"})
    assert history.series("d")["t"] == []

"""Usage metering on real PostgreSQL: records are written in batches and rolled up per day
and per adapter for the tenant only."""

from __future__ import annotations

import asyncio

import pytest
from support.control_plane import fresh_database
from support.gateway_catalog import add_adapter_version, seed_catalog

from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.gateway.usage import Usage, UsageRecorder
from loraplex.platform.services.tenants import create_tenant
from loraplex.platform.services.usage_report import usage_report


@pytest.fixture(scope="module")
def world(pg_url: str):
    factory = make_sessionmaker(fresh_database(pg_url))
    with factory() as s, s.begin():
        t1 = create_tenant(s, "acme")
        t2 = create_tenant(s, "globex")
        base, dep = seed_catalog(s)
        _, v1 = add_adapter_version(s, t1.id, base, "sql")
        ids = (t1.id, t2.id, dep.id, v1.id)
    return factory, ids


def test_batches_and_report(world) -> None:
    factory, (t1, t2, dep, v1) = world

    async def main() -> UsageRecorder:
        rec = UsageRecorder(factory, batch_size=5, interval_s=0.2)
        rec.start()
        for i in range(12):
            rec.record(
                Usage(
                    t1,
                    "sql",
                    10,
                    i,
                    cached_tokens=4,
                    latency_ms=100,
                    deployment_id=dep,
                    adapter_version_id=v1,
                )
            )
        for _ in range(3):
            rec.record(Usage(t1, "tiny-base", 7, 1, deployment_id=dep))
        rec.record(Usage(t2, "other", 1, 1))
        await asyncio.sleep(0.6)
        await rec.stop()
        return rec

    rec = asyncio.run(main())
    assert 1 <= rec.flushed_batches <= 4  # batched: far fewer writes than records
    with factory() as s:
        rows = usage_report(s, t1)
    by_model = {r["model"]: r for r in rows}
    assert set(by_model) == {"sql", "tiny-base"}
    sql = by_model["sql"]
    assert sql["adapter"] == "sql" and sql["adapter_version"] == 1
    assert sql["requests"] == 12 and sql["prompt_tokens"] == 120
    assert sql["completion_tokens"] == sum(range(12))
    assert sql["cached_tokens"] == 48 and sql["avg_latency_ms"] == 100.0
    base = by_model["tiny-base"]
    assert base["adapter"] is None and base["requests"] == 3
    assert all(len(r["day"]) == 10 for r in rows)
    with factory() as s:
        assert [r["model"] for r in usage_report(s, t2)] == ["other"]

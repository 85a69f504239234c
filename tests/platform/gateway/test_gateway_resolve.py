"""Model resolution on real PostgreSQL + Redis: NAME (latest ready), NAME:N, base names,
tenant isolation (404 model_not_found), and the cache invalidated on change."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis as sync_redis
from redis.asyncio import Redis
from support.control_plane import fresh_database
from support.gateway_catalog import add_adapter_version, seed_catalog

from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.resolve import ModelResolver, resolve_uncached
from loraplex.platform.services.deployments import set_tool_call_format
from loraplex.platform.services.resolution_events import bump_generation
from loraplex.platform.services.tenants import create_tenant
from loraplex.platform.wire.auth import cache_salt


@pytest.fixture(scope="module")
def world(pg_url: str):
    factory = make_sessionmaker(fresh_database(pg_url))
    with factory() as s, s.begin():
        t1 = create_tenant(s, "acme")
        t2 = create_tenant(s, "globex")
        base, dep = seed_catalog(s)
        add_adapter_version(s, t1.id, base, "sql")  # v1 ready
        add_adapter_version(s, t1.id, base, "sql")  # v2 ready
        _, v3 = add_adapter_version(s, t1.id, base, "sql", "failed")  # v3 failed
        v3.error = "rank too large: 16 > max_lora_rank 8"
        add_adapter_version(s, t1.id, base, "draft", "validating")
        add_adapter_version(s, t2.id, base, "secret")
        ids = (t1.id, t2.id, base, dep)
    return factory, ids


def test_resolution_rules(world) -> None:
    factory, (t1, t2, base, dep) = world
    with factory() as s:
        latest = resolve_uncached(s, t1, "sql")
        assert latest.adapter_version == 2 and latest.deployment_name == dep.name
        assert latest.adapter_key is not None and len(latest.adapter_key) == 64
        assert resolve_uncached(s, t1, "sql:1").adapter_version == 1
        assert latest.cache_salt(t1, "s") == cache_salt("s", str(t1))
        b = resolve_uncached(s, t1, base.name)
        assert b.adapter_id is None and b.base_model_name == base.name
        for model in ("sql:9", "nope"):
            with pytest.raises(HttpError) as info:
                resolve_uncached(s, t1, model)
            assert info.value.status == 404 and info.value.code == "model_not_found"


def test_the_deployments_tool_call_format_is_resolved(world) -> None:
    """The deployment row's `tool_call_format` (set through the deployments service) reaches
    the resolved model and its route, for the gateway's reading of `auto` tool calls."""
    factory, (t1, _, base, dep) = world
    with factory() as s:
        assert resolve_uncached(s, t1, "sql").tool_call_format is None
    try:
        with factory() as s, s.begin():
            set_tool_call_format(s, dep.id, "llama3_json")
        with factory() as s:
            got = resolve_uncached(s, t1, "sql")
            assert got.tool_call_format == "llama3_json"
            assert [r.tool_call_format for r in got.deployment_routes] == ["llama3_json"]
            assert resolve_uncached(s, t1, base.name).tool_call_format == "llama3_json"
    finally:
        with factory() as s, s.begin():
            set_tool_call_format(s, dep.id, None)


def test_adapter_not_ready_says_so_and_why(world) -> None:
    """An adapter that exists but has no ready version (failed, or still validating) is not a
    404: a 409 `adapter_not_ready` that names its state and, when it failed, the reason."""
    factory, (t1, _, _, _) = world
    with factory() as s:
        with pytest.raises(HttpError) as failed:
            resolve_uncached(s, t1, "sql:3")
        assert failed.value.status == 409 and failed.value.code == "adapter_not_ready"
        assert "failed validation" in failed.value.message
        assert "rank too large" in failed.value.message
        with pytest.raises(HttpError) as draft:
            resolve_uncached(s, t1, "draft")
        assert draft.value.status == 409 and draft.value.code == "adapter_not_ready"
        assert "validating" in draft.value.message


def test_other_tenants_adapter_is_404(world) -> None:
    factory, (t1, t2, _, _) = world
    with factory() as s:
        assert resolve_uncached(s, t2, "secret").adapter_name == "secret"
        with pytest.raises(HttpError) as info:
            resolve_uncached(s, t1, "secret")
        assert info.value.status == 404 and info.value.code == "model_not_found"
        with pytest.raises(HttpError):
            resolve_uncached(s, t2, "sql")


def test_cache_is_invalidated_on_change(world, redis_url: str) -> None:
    factory, (t1, _, base, _) = world

    async def main():
        redis = Redis.from_url(redis_url)
        resolver = ModelResolver(redis)
        try:
            first = await resolver.resolve(factory, t1, "sql")
            with factory() as s, s.begin():
                add_adapter_version(s, t1, base, "sql")  # v4 ready
            stale = await resolver.resolve(factory, t1, "sql")  # cached until told
            client = sync_redis.Redis.from_url(redis_url)
            bump_generation(client, t1)
            client.close()
            fresh = await resolver.resolve(factory, t1, "sql")
            return first, stale, fresh
        finally:
            await redis.aclose()

    first, stale, fresh = asyncio.run(main())
    assert first.adapter_version == 2 and stale.adapter_version == 2
    assert fresh.adapter_version == 4


def test_misses_are_not_cached(world, redis_url: str) -> None:
    factory, (t1, _, base, _) = world

    async def main():
        redis = Redis.from_url(redis_url)
        resolver = ModelResolver(redis)
        try:
            with pytest.raises(HttpError):
                await resolver.resolve(factory, t1, "late")
            with factory() as s, s.begin():
                add_adapter_version(s, t1, base, "late")
            return await resolver.resolve(factory, t1, "late")
        finally:
            await redis.aclose()

    assert asyncio.run(main()).adapter_name == "late"


def test_adapter_key_and_ref_cover_the_config() -> None:
    """The router's affinity key is the replica's cache key, and it changes with the config."""
    import uuid

    from loraplex.platform.engine.lora.sources import AdapterRef
    from loraplex.platform.gateway.resolve import ResolvedModel, adapter_ref

    w, c1, c2 = "a" * 64, "b" * 64, "c" * 64
    common = dict(
        model="m", base_model_id=uuid.uuid4(), base_model_name="b", base_object_prefix="models/b/",
        deployment_id=uuid.uuid4(), deployment_name="d", share_prefix_cache=False,
        adapter_sha256=w, adapter_object_prefix="tenants/t/adapters/a/v1/",
    )  # fmt: skip
    one = ResolvedModel(**common, adapter_config_sha256=c1)
    two = ResolvedModel(**common, adapter_config_sha256=c2)
    assert one.adapter_key != two.adapter_key
    tenant = uuid.uuid4()
    for resolved in (one, two):
        ref = adapter_ref(resolved, tenant)
        assert ref is not None and ref.config_sha256 == resolved.adapter_config_sha256
        assert AdapterRef(**ref.model_dump()).key == resolved.adapter_key
    legacy = ResolvedModel(**common)  # a version validated before config_sha256 was recorded
    assert legacy.adapter_key == w == AdapterRef(**adapter_ref(legacy, tenant).model_dump()).key


def test_concurrent_misses_share_one_query(world, redis_url: str) -> None:
    """A wave of requests for one model after the cache expired (64 streams arriving together)
    asks the database once, not once per request (issue 29's profile: a third of the API's
    samples were these queries); a miss is shared too, and is not cached."""
    from sqlalchemy import event

    factory, (t1, _, _, _) = world
    queries: list[str] = []

    def count(_conn, _cursor, statement, *_a) -> None:  # noqa: ANN001
        queries.append(statement)

    async def main():
        redis = Redis.from_url(redis_url)
        resolver = ModelResolver(redis)
        engine = factory.kw["bind"]
        event.listen(engine, "before_cursor_execute", count)
        try:
            got = await asyncio.gather(*(resolver.resolve(factory, t1, "sql") for _ in range(64)))
            hits = len(queries)
            queries.clear()
            missing = await asyncio.gather(
                *(resolver.resolve(factory, t1, "nope") for _ in range(16)), return_exceptions=True
            )
            return got, hits, len(queries), missing
        finally:
            event.remove(engine, "before_cursor_execute", count)
            await redis.aclose()

    got, hits, miss_queries, missing = asyncio.run(main())
    assert len({g.adapter_version for g in got}) == 1
    one = len(resolve_queries(factory, t1, "sql"))
    assert hits == one, (hits, one)
    assert all(isinstance(m, HttpError) and m.status == 404 for m in missing)
    assert miss_queries == len(resolve_queries(factory, t1, "nope"))


def resolve_queries(factory, tenant, model: str) -> list[str]:  # noqa: ANN001
    """The statements one uncached resolution runs."""
    from sqlalchemy import event

    seen: list[str] = []

    def count(_conn, _cursor, statement, *_a) -> None:  # noqa: ANN001
        seen.append(statement)

    engine = factory.kw["bind"]
    event.listen(engine, "before_cursor_execute", count)
    try:
        with factory() as s, contextlib.suppress(HttpError):
            resolve_uncached(s, tenant, model)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return seen


def test_an_answer_past_its_ttl_is_served_at_once_and_read_again_behind(
    world, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TTL still bounds a lost bump (a change with no generation bump is seen once the
    refresh lands), but the query that reads an answer again runs behind the request, not in
    its first token (it sat in one request's every `ttl_s`, a few ms at the p95)."""
    import time

    import loraplex.platform.gateway.resolve as resolve_module

    factory, (t1, _, base, _) = world
    with factory() as s, s.begin():
        add_adapter_version(s, t1, base, "ttl")  # v1
    real = resolve_module._resolve_in_session

    def slow(*args):  # noqa: ANN002, ANN202
        time.sleep(0.5)
        return real(*args)

    async def main():
        redis = Redis.from_url(redis_url)
        resolver = ModelResolver(redis, ttl_s=0.05)
        try:
            first = await resolver.resolve(factory, t1, "ttl")
            with factory() as s, s.begin():
                add_adapter_version(s, t1, base, "ttl")  # v2, and no bump: a lost one
            await asyncio.sleep(0.1)  # past the TTL
            monkeypatch.setattr(resolve_module, "_resolve_in_session", slow)
            began = time.monotonic()
            served = await resolver.resolve(factory, t1, "ttl")
            took = time.monotonic() - began
            await asyncio.sleep(0.8)  # the refresh lands
            monkeypatch.setattr(resolve_module, "_resolve_in_session", real)
            later = await resolver.resolve(factory, t1, "ttl")
            return first, served, took, later
        finally:
            await redis.aclose()

    first, served, took, later = asyncio.run(main())
    assert first.adapter_version == 1 and served.adapter_version == 1
    assert took < 0.3, took
    assert later.adapter_version == 2


def test_an_answer_whose_refresh_fails_is_dropped(world, redis_url: str) -> None:
    """An adapter gone without a bump: the refresh behind the request fails, and the next
    request resolves for itself (and gets the 404), not the dead answer again."""
    from sqlalchemy import delete, select

    from loraplex.platform.db.models import Adapter, AdapterVersion

    factory, (t1, _, base, _) = world
    with factory() as s, s.begin():
        add_adapter_version(s, t1, base, "doomed")

    async def main():
        redis = Redis.from_url(redis_url)
        resolver = ModelResolver(redis, ttl_s=0.05)
        try:
            first = await resolver.resolve(factory, t1, "doomed")
            with factory() as s, s.begin():
                adapter = s.execute(
                    select(Adapter).where(Adapter.tenant_id == t1, Adapter.name == "doomed")
                ).scalar_one()
                s.execute(delete(AdapterVersion).where(AdapterVersion.adapter_id == adapter.id))
                s.delete(adapter)
            await asyncio.sleep(0.1)
            served = await resolver.resolve(factory, t1, "doomed")  # past its TTL: served once
            await asyncio.sleep(0.5)  # the refresh fails
            with pytest.raises(HttpError) as info:
                await resolver.resolve(factory, t1, "doomed")
            return first, served, info.value
        finally:
            await redis.aclose()

    first, served, err = asyncio.run(main())
    assert first.adapter_name == served.adapter_name == "doomed"
    assert err.status == 404

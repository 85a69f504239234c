"""The gateway verifies an API key against PostgreSQL once, then from its own cache: a
request with a known key costs no database query. A revocation, a suspension or new limits
reach every gateway on the very next request (the change bumps a generation in Redis when its
transaction commits), not after the cache's TTL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from loraplex.platform.db.session import get_engine, make_sessionmaker, session_scope
from loraplex.platform.services import tenants


@pytest.fixture()
def key_queries(cp_settings: Any) -> Iterator[list[str]]:
    """SQL statements of this process that read the api_keys table, as they run."""
    seen: list[str] = []
    engine = get_engine(cp_settings.database_url)

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM api_keys" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _tenant_with_key(client: TestClient, admin: dict[str, str]) -> tuple[str, str, dict]:
    t = client.post("/admin/v1/tenants", headers=admin, json={"name": f"kc-{uuid.uuid4().hex[:8]}"})
    assert t.status_code == 201, t.text
    k = client.post(
        f"/admin/v1/tenants/{t.json()['id']}/api-keys", headers=admin, json={"name": "k"}
    )
    assert k.status_code == 201, k.text
    return t.json()["id"], k.json()["id"], {"Authorization": f"Bearer {k.json()['key']}"}


def test_a_known_key_costs_no_database_query(
    client: TestClient, admin_headers: dict[str, str], key_queries: list[str]
) -> None:
    _, _, headers = _tenant_with_key(client, admin_headers)
    assert client.get("/v1/limits", headers=headers).status_code == 200
    first = len(key_queries)
    assert first >= 1
    for _ in range(5):
        assert client.get("/v1/limits", headers=headers).status_code == 200
    assert len(key_queries) == first


def test_revocation_applies_on_the_next_request(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    _, key_id, headers = _tenant_with_key(client, admin_headers)
    assert client.get("/v1/limits", headers=headers).status_code == 200
    assert client.delete(f"/admin/v1/api-keys/{key_id}", headers=admin_headers).status_code == 200
    refused = client.get("/v1/limits", headers=headers)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"


def test_suspension_and_new_limits_apply_on_the_next_request(
    client: TestClient, admin_headers: dict[str, str], cp_settings: Any
) -> None:
    tenant_id, _, headers = _tenant_with_key(client, admin_headers)
    assert client.get("/v1/limits", headers=headers).status_code == 200
    changed = client.patch(
        f"/admin/v1/tenants/{tenant_id}", headers=admin_headers, json={"requests_per_minute": 7}
    )
    assert changed.status_code == 200, changed.text
    limits = client.get("/v1/limits", headers=headers).json()
    assert limits["requests_per_minute"]["limit"] == 7
    with session_scope(make_sessionmaker(cp_settings.database_url)) as session:
        tenants.set_suspended(session, uuid.UUID(tenant_id), True)
    refused = client.get("/v1/limits", headers=headers)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "tenant_suspended"


def test_requests_arriving_together_verify_a_new_key_once(
    client: TestClient, admin_headers: dict[str, str], key_queries: list[str]
) -> None:
    """A wave of requests with one key the gateway has not cached (a client's 64 streams, or
    all of them after the TTL) asks the database once, not once per request (issue 29)."""
    import asyncio

    _, _, headers = _tenant_with_key(client, admin_headers)
    token = headers["Authorization"].removeprefix("Bearer ")
    gw = client.app.state.gateway  # type: ignore[attr-defined]

    async def wave() -> list[Any]:
        return list(await asyncio.gather(*(gw.key_use(token) for _ in range(24))))

    before = len(key_queries)
    assert client.portal is not None
    uses = client.portal.call(wave)
    assert len({u.key_id for u in uses}) == 1
    assert len(key_queries) - before == 1, len(key_queries) - before


def test_the_adapter_api_verifies_a_known_key_from_the_cache_too(
    client: TestClient, admin_headers: dict[str, str], key_queries: list[str]
) -> None:
    """The adapter API's requests (and its refusals: a flood of refused uploads) cost no key
    query and no write once the key is known; a revocation still applies at once."""
    _, key_id, headers = _tenant_with_key(client, admin_headers)
    assert client.get("/v1/adapters", headers=headers).status_code == 200
    first = len(key_queries)
    for _ in range(5):
        assert client.get("/v1/adapters", headers=headers).status_code == 200
    assert len(key_queries) == first
    assert client.delete(f"/admin/v1/api-keys/{key_id}", headers=admin_headers).status_code == 200
    assert client.get("/v1/adapters", headers=headers).status_code == 401


def test_a_known_key_and_its_tenants_names_are_read_in_one_round_trip(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    """Every inference request checks the auth generation and its tenant's resolution
    generation: one call to Redis for both once the key is known (it was two, each a wait
    that a busy core stretches), and a bump of either is seen by the next request."""
    tenant_id, _, headers = _tenant_with_key(client, admin_headers)
    token = headers["Authorization"].removeprefix("Bearer ")
    gw = client.app.state.gateway  # type: ignore[attr-defined]

    async def check() -> tuple[Any, Any, int]:
        calls = 0
        sent = gw.redis.execute_command

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return await sent(*args, **kwargs)

        gw.redis.execute_command = counted
        try:
            use, names = await gw.key_check(token)
        finally:
            gw.redis.execute_command = sent
        return use, names, calls

    async def bump() -> None:
        await gw.resolver.invalidate(tenant_id)

    assert client.portal is not None
    client.portal.call(check)  # the key verified and kept
    use, names, calls = client.portal.call(check)
    assert str(use.tenant_id) == tenant_id and calls == 1
    client.portal.call(bump)
    _, after, _ = client.portal.call(check)
    assert after.value != names.value
    assert after.value == client.portal.call(gw.resolver.generation, tenant_id)

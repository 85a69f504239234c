"""Fixtures for the API tests: per-module control plane (fresh DB, bucket, queue), a real
Celery worker, the tiny base model registered, an app client and tenant factories."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.control_plane import running_worker
from support.fixtures import adapter_r4, adapter_r16, base_model, cp_settings, tiny_llama

__all__ = ["adapter_r4", "adapter_r16", "base_model", "cp_settings", "tiny_llama"]

RANK_LIMIT = 8
LOOP_STALL_MS = 50.0


@pytest.fixture(autouse=True)
def event_loop_never_blocked() -> Iterator[None]:
    """Every API test fails if any callback on an event loop of this process (the in-process
    apps' requests) held its loop for more than 50 ms of CPU: CPU-heavy work (hashing,
    password checks, tokenizing) belongs in worker threads, off the loop."""
    from loraplex.platform.loop_watch import collect

    stalls, stop = collect(LOOP_STALL_MS)
    try:
        yield
    finally:
        stop()
    if stalls:
        worst = sorted(stalls, key=lambda s: -s.cpu_ms)[:5]
        pytest.fail(
            "the event loop was blocked: "
            + "; ".join(f"{s.cpu_ms} ms CPU in {s.callback}" for s in worst),
            pytrace=False,
        )


@pytest.fixture(scope="module")
def worker(cp_settings: Any) -> Iterator[Any]:
    """A real Celery worker on this module's queue."""
    with running_worker(cp_settings) as w:
        yield w


@pytest.fixture(scope="module")
def client(cp_settings: Any) -> Iterator[TestClient]:
    """An HTTP client of the app built for this module's settings."""
    from loraplex.api.app import create_app

    with TestClient(create_app(cp_settings), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def admin_headers(cp_settings: Any) -> dict[str, str]:
    """Authorization for the admin API."""
    return {"Authorization": f"Bearer {cp_settings.admin_key}"}


@pytest.fixture(scope="module")
def deployment(client: TestClient, admin_headers: dict[str, str], base_model: str) -> dict:
    """A deployment of the base model with max_lora_rank 8 (the adapters' rank limit)."""
    resp = client.post(
        "/admin/v1/deployments",
        headers=admin_headers,
        json={
            "name": "tiny-dep",
            "base_model": base_model,
            "quantization": {"weights": "bf16", "kv_cache": "auto"},
            "max_loras": 4,
            "max_lora_rank": RANK_LIMIT,
        },
    )
    assert resp.status_code == 201, resp.text
    return resp.json()


@pytest.fixture(scope="module")
def make_tenant(
    client: TestClient, admin_headers: dict[str, str]
) -> Callable[[], tuple[str, dict[str, str]]]:
    """Create a tenant with one API key; returns (tenant id, its auth headers)."""

    def make() -> tuple[str, dict[str, str]]:
        t = client.post(
            "/admin/v1/tenants", headers=admin_headers, json={"name": f"t-{uuid.uuid4().hex[:10]}"}
        )
        assert t.status_code == 201, t.text
        k = client.post(
            f"/admin/v1/tenants/{t.json()['id']}/api-keys",
            headers=admin_headers,
            json={"name": "test"},
        )
        assert k.status_code == 201, k.text
        return t.json()["id"], {"Authorization": f"Bearer {k.json()['key']}"}

    return make

"""A client that leaves before its first token still pays for the prompt the engine computed
(issue 22, item 10): the gateway aborts the request at once, the replica answers the abort with
the prompt tokens it had run, and the gateway records them as usage and charges them to the
tenant's quota. The API runs under uvicorn in its own process (a real disconnect), over real
PostgreSQL, S3 and Redis; a scripted replica (a real HTTP server) stands in for the engine,
holding its first token back."""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from support.control_plane import control_plane
from support.gateway_catalog import make_model_dir, seed_catalog
from support.gateway_stack import Api, settings_env
from support.scripted_replica import ScriptedReplica, register_url

from loraplex.platform.db.models import UsageRecord
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services.api_keys import create_api_key
from loraplex.platform.services.tenants import create_tenant

pytestmark = pytest.mark.timeout(180)
COMPUTED = 37


def test_leaving_before_the_first_token_meters_the_computed_prompt(
    pg_url: str,
    settings: Any,
    s3_client: Any,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    work = tmp_path_factory.mktemp("metering")
    with control_plane(pg_url, settings, s3_client, "metering") as cp:
        base = f"meter-{uuid.uuid4().hex[:8]}"
        for f in make_model_dir(work / base).iterdir():
            s3_client.put_object(
                Bucket=cp.s3_bucket, Key=f"models/{base}/{f.name}", Body=f.read_bytes()
            )
        factory = make_sessionmaker(cp.database_url)
        with session_scope(factory) as session:
            _, dep = seed_catalog(session, base)
            dep_name = dep.name
            tenant = create_tenant(session, f"leaver-{uuid.uuid4().hex[:6]}")
            tenant_id = tenant.id
            _, key = create_api_key(session, tenant.id, "k")
        with ScriptedReplica([5, 6, 7], delay_s=30.0, computed_prompt_tokens=COMPUTED) as replica:
            register_url(redis_url, dep_name, replica.url)
            api = Api(settings_env(cp, usage_flush_interval_s=0.2), work)
            try:
                _leave_before_first_token(api.url, key, base, replica)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    with factory() as session:
                        used = session.scalar(
                            select(func.coalesce(func.sum(UsageRecord.prompt_tokens), 0)).where(
                                UsageRecord.tenant_id == tenant_id
                            )
                        )
                    if used:
                        break
                    time.sleep(0.2)
                assert used == COMPUTED
                limits = httpx.get(
                    f"{api.url}/v1/limits", headers={"Authorization": f"Bearer {key}"}
                ).json()
                assert limits["monthly_tokens"]["used"] == COMPUTED
            finally:
                api.stop()


def _leave_before_first_token(url: str, key: str, model: str, replica: ScriptedReplica) -> None:
    body = json.dumps(
        {"model": model, "prompt": "hello " * 20, "max_tokens": 3, "stream": True}
    ).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 20
        while not replica.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replica.requests, "the request never reached the replica"
    # The socket is closed: the gateway must abort now, well before the first token (30 s).
    deadline = time.monotonic() + 10
    while not replica.aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert replica.aborted, "the gateway did not abort when its client left"

"""Cold starts and graceful shutdown end to end, over real PostgreSQL, S3 and Redis with the
API (`loraplex api`) and engine replicas (`loraplex engine`) as subprocesses:

- a request sent while the deployment's only replica is still starting waits for it (instead
  of 503) and is served; the wait shows in the client's time to first token and in the
  gateway's metrics;
- SIGTERM to the API mid-stream: new requests are refused, the running stream completes, the
  process exits 0;
- SIGTERM to a replica mid-generation: it stops taking connections, finishes the request,
  exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.console import make_operator, sign_in
from support.control_plane import fresh_database
from support.gateway_stack import WIRE_HEADERS, Api, settings_env
from support.scripted_replica import ScriptedReplica

from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.embedded.process import http_ok
from loraplex.platform.engine_spec import parse_engine_args
from loraplex.platform.gateway.replicas import Heartbeat, ReplicaInfo, http_health_check
from loraplex.platform.local_processes import start_engine_process
from loraplex.platform.services.api_keys import create_api_key
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.services.tenants import create_tenant
from loraplex.platform.wire import FinishEvent, GenerateRequest, SamplingOptions, decode_event

pytestmark = pytest.mark.timeout(400)
MESSAGES = [{"role": "user", "content": "Hello there"}]


class Stack:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


@pytest.fixture(scope="module")
def stack(pg_url: str, settings: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("lifecycle")
    db_url = fresh_database(pg_url, "lifecycle")
    tag = uuid.uuid4().hex[:8]
    s = settings.model_copy(update={"database_url": db_url, "data_dir": work / "data",
                                    "rate_limit_rpm": 100_000, "drain_timeout_s": 30.0})  # fmt: skip
    model_dir = make_demo_model(work / "demo")
    base, dep = f"demo-{tag}", f"demo-dep-{tag}"
    register_base_model(s, base, model_dir)
    with session_scope(make_sessionmaker(db_url)) as session:
        dep_id = create_deployment(session, s, DeploymentSpec(
            name=dep, base_model=base, weight_quantization="fp32", cold_start_wait_s=240)).id  # fmt: skip
        tenant = create_tenant(session, f"acme-{tag}")
        _, key = create_api_key(session, tenant.id, "k")
    return Stack(settings=s, work=work, model_dir=model_dir, base=base, deployment=dep, key=key,
                 redis_url=redis_url, deployment_id=dep_id)  # fmt: skip


def _chat_stream(client: httpx.Client, api_url: str, st: Stack, max_tokens: int):
    return client.stream(
        "POST",
        f"{api_url}/v1/chat/completions",
        headers={"authorization": f"Bearer {st.key}"},
        json={"model": st.base, "messages": MESSAGES, "max_tokens": max_tokens,
              "temperature": 0, "stream": True},
    )  # fmt: skip


def _sse_data(resp: httpx.Response):
    for line in resp.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


def _samples(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_a_request_waits_for_a_replica_that_becomes_ready_late(stack: Stack) -> None:
    st = stack
    api = Api(settings_env(st.settings), st.work)
    config, _ = parse_engine_args(["--model", str(st.model_dir)])
    log = st.work / "late-replica.log"
    url, proc = start_engine_process(config, log, settings_env(st.settings, "engine"), timeout=None)
    # The tiny engine can load before the request is sent; a gate on its health check keeps
    # it "starting" until the request is in flight, so the wait is there on any machine.
    gate = threading.Event()
    probe = http_health_check(url)
    heartbeat = Heartbeat(st.redis_url, ReplicaInfo(st.deployment, url), ttl_s=15.0,
                          healthy=lambda: gate.is_set() and probe()).start()  # fmt: skip
    try:
        assert not heartbeat.ready.is_set()  # announced as starting, not ready
        admin = {"authorization": f"Bearer {st.settings.admin_key}"}
        replicas_url = f"{api.url}/admin/v1/deployments/{st.deployment_id}/replicas"
        seen = httpx.get(replicas_url, headers=admin, timeout=10).json()
        assert (seen["desired"], seen["ready"], seen["starting"]) == (1, 0, 1), seen
        # The console's overview shows it as starting.
        with httpx.Client(base_url=api.url, timeout=30) as console:
            email = f"ops-{uuid.uuid4().hex[:6]}@example.com"
            make_operator(st.settings.database_url, email, "viewer")
            assert sign_in(console, email).status_code == 303
            page = console.get("/console/partials/replicas")
            assert page.status_code == 200, page.text[:500]
            assert "1 replica(s) starting (cold start)" in page.text, page.text[:2000]
        began = time.monotonic()
        threading.Timer(1.0, gate.set).start()  # ready one second into the request
        ttft = None
        chunks = []
        with httpx.Client(timeout=300) as client, _chat_stream(client, api.url, st, 8) as resp:
            assert resp.status_code == 200, resp.read()
            for data in _sse_data(resp):
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if (
                    ttft is None
                    and chunk["choices"]
                    and chunk["choices"][0]["delta"].get("content")
                ):
                    ttft = time.monotonic() - began
                chunks.append(chunk)
        assert ttft is not None and chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        seen = httpx.get(replicas_url, headers=admin, timeout=10).json()
        assert (seen["ready"], seen["starting"]) == (1, 0), seen
        metrics = httpx.get(f"{api.url}/metrics", timeout=10).text
        labels = (("deployment", st.deployment), ("outcome", "ready"))
        assert _samples(metrics, "loraplex:gateway_cold_start_wait_seconds_count")[labels] == 1
        waited = _samples(metrics, "loraplex:gateway_cold_start_wait_seconds_sum")[labels]
        assert 0.2 < waited <= ttft, (waited, ttft)  # the engine took a while to load
        gw_ttft = _samples(metrics, "loraplex:gateway_time_to_first_token_seconds_sum")
        assert gw_ttft[(("deployment", st.deployment),)] >= waited
    finally:
        heartbeat.stop()
        proc.stop()
        api.stop()


def test_sigterm_to_the_api_finishes_its_streams_and_refuses_new_ones(stack: Stack) -> None:
    st = stack
    with ScriptedReplica(list(range(10, 50)), delay_s=0.05) as rep:
        heartbeat = Heartbeat(st.redis_url, ReplicaInfo(st.deployment, rep.url), ttl_s=15).start()
        api = Api(settings_env(st.settings), st.work)
        try:
            before = after = 0
            done = False
            with httpx.Client(timeout=60) as client, _chat_stream(client, api.url, st, 40) as resp:
                assert resp.status_code == 200
                for data in _sse_data(resp):
                    if before == 0:
                        before = 1
                        os.kill(api.proc.pid, signal.SIGTERM)  # mid-stream
                        time.sleep(0.5)
                        # New requests: the listening socket is closed (or 503 while closing).
                        try:
                            new = httpx.get(f"{api.url}/healthz", timeout=5)
                            assert new.status_code == 503, new.text
                        except httpx.ConnectError:
                            pass
                        continue
                    if data == "[DONE]":
                        done = True
                        break
                    after += 1
            assert done and after >= 10  # most of the stream came after the SIGTERM
            assert api.proc.proc.wait(timeout=60) == 0, api.proc.log_path.read_text()[-3000:]
        finally:
            heartbeat.stop()
            api.stop()


def test_sigterm_to_a_replica_drains_its_running_request(stack: Stack) -> None:
    st = stack
    config, _ = parse_engine_args(["--model", str(st.model_dir)])
    log = st.work / "drain-replica.log"
    url, proc = start_engine_process(config, log, settings_env(st.settings, "engine"), timeout=180)
    try:
        req = GenerateRequest(
            request_id=uuid.uuid4().hex,
            prompt_token_ids=[5, 6, 7, 8],
            sampling=SamplingOptions(max_tokens=300, ignore_eos=True, temperature=0.0),
        )
        tokens_after = 0
        finish = None
        with (
            httpx.Client(timeout=120) as client,
            client.stream(
                "POST", f"{url}/generate", headers=WIRE_HEADERS, content=req.model_dump_json()
            ) as resp,
        ):
            assert resp.status_code == 200
            signalled = False
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = decode_event(line[len("data: ") :])
                if not signalled:
                    os.kill(proc.pid, signal.SIGTERM)  # mid-generation
                    signalled = True
                    time.sleep(0.5)
                    with pytest.raises(Exception):  # noqa: B017 - refused or 503: not taken
                        assert http_ok(f"{url}/health", timeout=2)
                    continue
                if isinstance(event, FinishEvent):
                    finish = event
                    break
                tokens_after += len(event.token_ids)
        assert finish is not None and finish.usage.completion_tokens == 300
        assert tokens_after > 0
        assert proc.proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        proc.stop()

"""The OpenAI-compatible gateway end to end, driven by the official `openai` SDK against a
running stack: the API app under uvicorn plus real engine replicas (subprocesses) serving the
demo model, over real PostgreSQL, S3 and Redis.

Tests that need adapters uploaded, validated and served by a replica are marked
`gateway_adapters` (select them alone with `-m gateway_adapters`).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis
from support.control_plane import fresh_database
from support.gateway_catalog import add_adapter_version
from support.gateway_clients import MESSAGES, aborted_count, run_clients, wait_idle
from support.gateway_stack import WIRE_HEADERS, Api, Replica, settings_env
from support.peft_adapters import make_peft_adapter
from support.uploads import upload_adapter

from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.gateway.replica_client import ReplicaClient
from loraplex.platform.gateway.replicas import ReplicaRegistry
from loraplex.platform.gateway.router import Dispatch, Router
from loraplex.platform.local_processes import start_worker_process
from loraplex.platform.services.api_keys import create_api_key, revoke_api_key
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.services.tenants import create_tenant
from loraplex.platform.wire import FinishEvent, GenerateRequest, SamplingOptions
from loraplex.platform.wire.prefix_hash import max_cached_blocks

pytestmark = pytest.mark.timeout(300)


class Stack:
    """What the tests need to reach the running stack."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def client(self, key: str | None = None, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.api.url}/v1",
            api_key=key or self.key_a,
            max_retries=0,
            timeout=60,
            **kw,
        )


@pytest.fixture(scope="module")
def stack(pg_url: str, settings: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("gwstack")
    db_url = fresh_database(pg_url)
    tag = uuid.uuid4().hex[:8]
    s = settings.model_copy(
        update={
            "database_url": db_url,
            "data_dir": work / "data",
            "stream_stall_timeout_s": 5.0,
            "rate_limit_rpm": 100_000,
        }
    )
    model_dir = make_demo_model(work / "demo")
    base_name, dep_name = f"demo-{tag}", f"demo-dep-{tag}"
    register_base_model(s, base_name, model_dir)
    factory = make_sessionmaker(db_url)
    with session_scope(factory) as session:
        create_deployment(
            session,
            s,
            DeploymentSpec(
                name=dep_name,
                base_model=base_name,
                weight_quantization="fp32",
                max_loras=4,
                max_lora_rank=16,
            ),
        )
        ta, tb = create_tenant(session, f"acme-{tag}"), create_tenant(session, f"globex-{tag}")
        _, key_a = create_api_key(session, ta.id, "a")
        _, key_b = create_api_key(session, tb.id, "b")
        ids = (ta.id, tb.id)
    # Replicas get the settings too: they fetch adapters from the same object store.
    replica = Replica(model_dir, dep_name, redis_url, work, env=settings_env(s, "engine"))
    api = Api(settings_env(s), work)
    st = Stack(
        api=api,
        replica=replica,
        settings=s,
        factory=factory,
        model_dir=model_dir,
        base=base_name,
        deployment=dep_name,
        key_a=key_a,
        key_b=key_b,
        tenant_a=ids[0],
        tenant_b=ids[1],
        redis_url=redis_url,
        work=work,
        assets=ModelAssets.load(model_dir),
    )
    try:
        yield st
    finally:
        api.stop()
        replica.stop()


@pytest.fixture(scope="module")
def offline(stack: Stack) -> LLM:
    return LLM(str(stack.model_dir))


def _chat_prompt_ids(stack: Stack, messages: list[dict[str, str]]) -> list[int]:
    text = stack.assets.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return stack.assets.tokenizer.encode(text, add_special_tokens=False)


def test_chat_matches_offline_engine_with_logprobs(stack: Stack, offline: LLM) -> None:
    resp = stack.client().chat.completions.create(
        model=stack.base,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    ids = _chat_prompt_ids(stack, MESSAGES)
    ref = offline.generate([ids], SamplingParams(temperature=0, max_tokens=12, logprobs=2))[0]
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == stack.assets.tokenizer.decode(ref.token_ids)
    assert choice.finish_reason == ref.finish_reason
    assert resp.usage.prompt_tokens == len(ids)
    assert resp.usage.completion_tokens == len(ref.token_ids)
    assert resp.usage.total_tokens == len(ids) + len(ref.token_ids)
    lps = choice.logprobs.content
    assert len(lps) == len(ref.token_ids)
    for entry, tok, ref_lp in zip(lps, ref.token_ids, ref.logprobs, strict=True):
        assert entry.logprob == pytest.approx(ref_lp[tok], abs=1e-4)
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_chat_stream_with_usage_equals_non_stream(stack: Stack) -> None:
    client = stack.client()
    full = client.chat.completions.create(
        model=stack.base, messages=MESSAGES, max_tokens=10, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=stack.base,
            messages=MESSAGES,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_and_not_with_logprobs(stack: Stack, offline: LLM) -> None:
    client = stack.client()
    prompt = "The library opens at nine in the morning and"
    resp = client.completions.create(
        model=stack.base, prompt=prompt, max_tokens=8, temperature=0, logprobs=2
    )
    ids = stack.assets.tokenizer.encode(prompt)
    ref = offline.generate([ids], SamplingParams(temperature=0, max_tokens=8))[0]
    assert resp.choices[0].text == stack.assets.tokenizer.decode(ref.token_ids)
    assert (
        len(resp.choices[0].logprobs.tokens) == resp.usage.completion_tokens == len(ref.token_ids)
    )
    assert all(len(top) <= 2 for top in resp.choices[0].logprobs.top_logprobs)
    streamed = list(
        client.completions.create(
            model=stack.base, prompt=prompt, max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == resp.choices[0].text
    # Token-id prompts and n > 1 with a seed.
    many = client.completions.create(
        model=stack.base, prompt=ids, max_tokens=5, n=3, seed=7, temperature=1.0
    )
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert many.usage.prompt_tokens == len(ids)


def test_prefix_cache_is_salted_per_tenant(stack: Stack) -> None:
    long = [
        {
            "role": "user",
            "content": "The train left the station on time, crossed the river, "
            "and climbed slowly into the hills. " * 4 + uuid.uuid4().hex,
        }
    ]
    a = stack.client(stack.key_a)
    first = a.chat.completions.create(model=stack.base, messages=long, max_tokens=2)
    again = a.chat.completions.create(model=stack.base, messages=long, max_tokens=2)
    other = stack.client(stack.key_b).chat.completions.create(
        model=stack.base, messages=long, max_tokens=2
    )
    assert first.usage.prompt_tokens > 48
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= 32  # same tenant: KV reused
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # another tenant: never shared
    # Nobody but the gateway can name tenant A's cache partition on the replica: without the
    # replica secret the replica refuses; with it, the guessable `tenant:<id>` salt of old
    # finds nothing, since the salt is an HMAC of the id under the secret.
    ids = _chat_prompt_ids(stack, long)
    probe = {"request_id": f"probe-{uuid.uuid4().hex}", "prompt_token_ids": ids,
             "sampling": {"max_tokens": 1}, "cache_salt": f"tenant:{stack.tenant_a}"}  # fmt: skip
    url = f"{stack.replica.url}/generate"
    version = {k: v for k, v in WIRE_HEADERS.items() if k != "authorization"}
    assert httpx.post(url, json=probe, headers=version, timeout=30).status_code == 401
    with httpx.stream("POST", url, json=probe, headers=WIRE_HEADERS, timeout=30) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line]
    assert events[-1]["usage"]["cached_tokens"] == 0


def test_stop_sequences_and_rate_limit_headers(stack: Stack) -> None:
    client = stack.client()
    full = (
        client.completions.create(
            model=stack.base, prompt="one, two, three,", max_tokens=12, temperature=0
        )
        .choices[0]
        .text
    )
    at = next(i for i in range(2, len(full)) if full[i].strip())
    stop = full[at : at + 2]
    cut = client.completions.create(
        model=stack.base, prompt="one, two, three,", max_tokens=12, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    raw = client.chat.completions.with_raw_response.create(
        model=stack.base, messages=MESSAGES, max_tokens=2
    )
    for h in (
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
    ):
        assert h in raw.headers


def test_bad_input_is_400_never_500(stack: Stack) -> None:
    client = stack.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=stack.base, messages=MESSAGES, temperature=3)
    assert info.value.status_code == 400 and info.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=stack.base, prompt="word " * 2100, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=stack.base, prompt="hi", max_tokens=2047)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert info.value.body["code"] == "model_not_found"
    r = httpx.post(
        f"{stack.api.url}/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {stack.key_a}"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_models_listing(stack: Stack) -> None:
    models = stack.client().models.list()
    ids = {m.id for m in models.data}
    assert stack.base in ids
    base = next(m for m in models.data if m.id == stack.base)
    assert base.model_extra["deployments"] == [
        {"name": stack.deployment, "quantization": {"weights": "fp32", "kv_cache": "auto"}}
    ]
    one = stack.client().models.retrieve(stack.base)
    assert one.id == stack.base
    with pytest.raises(openai.NotFoundError):
        stack.client().models.retrieve("nope")


def test_a_base_model_no_deployment_serves_is_not_a_model(stack: Stack) -> None:
    """Registered but not deployed: not listed, and calling it is a 404, never a 5xx."""
    idle = f"{stack.base}-idle"
    register_base_model(stack.settings, idle, stack.model_dir)
    assert idle not in {m.id for m in stack.client().models.list().data}
    with pytest.raises(openai.NotFoundError) as err:
        stack.client().completions.create(model=idle, prompt="hi", max_tokens=1)
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        stack.client().models.retrieve(idle)


def test_cross_tenant_and_revoked_keys(stack: Stack) -> None:
    with session_scope(stack.factory) as session:
        add_adapter_version(session, stack.tenant_a, stack.base, "private-a")
    a_models = {m.id: m for m in stack.client(stack.key_a).models.list().data}
    assert "private-a" in a_models and a_models["private-a"].model_extra["parent"] == stack.base
    b = stack.client(stack.key_b)
    assert "private-a" not in {m.id for m in b.models.list().data}
    for call in (
        lambda: b.chat.completions.create(model="private-a", messages=MESSAGES),
        lambda: b.completions.create(model="private-a:1", prompt="x"),
        lambda: b.models.retrieve("private-a"),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert info.value.body["code"] == "model_not_found"
    r = httpx.post(
        f"{stack.api.url}/v1/adapters/private-a/chat/completions",
        json={"model": "x", "messages": MESSAGES},
        headers={"Authorization": f"Bearer {stack.key_b}"},
    )
    assert r.status_code == 404
    # A revoked key is refused on the very next call.
    with session_scope(stack.factory) as session:
        key_row, plain = create_api_key(session, stack.tenant_b, "short-lived")
    c = stack.client(plain)
    c.chat.completions.create(model=stack.base, messages=MESSAGES, max_tokens=1)
    with session_scope(stack.factory) as session:
        revoke_api_key(session, key_row.id)
    with pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model=stack.base, messages=MESSAGES, max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        stack.client("lp_not-a-key").models.list()


@pytest.mark.gateway_adapters
def test_usage_endpoint(stack: Stack, adapters: dict[str, Path]) -> None:
    stack.client().chat.completions.create(model=stack.base, messages=MESSAGES, max_tokens=3)
    # Tenant A calls its own adapter too: B's report must not show that (real) usage.
    stack.client().chat.completions.create(model="ad4", messages=MESSAGES, max_tokens=3)
    deadline = time.monotonic() + 10
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        r = httpx.get(
            f"{stack.api.url}/v1/usage", headers={"Authorization": f"Bearer {stack.key_a}"}
        )
        assert r.status_code == 200
        rows = r.json()["data"]
        models = {row["model"] for row in rows if row["requests"] >= 1}
        if {stack.base, "ad4"} <= models:
            break
        time.sleep(0.3)
    base = [row for row in rows if row["model"] == stack.base]
    assert base and base[0]["prompt_tokens"] > 0 and base[0]["adapter"] is None
    assert any(row["model"] == "ad4" and row["adapter"] == "ad4" for row in rows)
    other = httpx.get(
        f"{stack.api.url}/v1/usage", headers={"Authorization": f"Bearer {stack.key_b}"}
    )
    assert other.status_code == 200
    assert all(row["model"] != "ad4" and row["adapter"] != "ad4" for row in other.json()["data"])


def test_20_concurrent_streams_with_drops_and_slow_readers(stack: Stack) -> None:
    run_clients(stack, [stack.base])
    wait_idle(stack.replica, timeout_s=8.0)


def test_disconnect_aborts_on_the_replica_at_once(stack: Stack) -> None:
    body = {"model": stack.base, "messages": MESSAGES, "max_tokens": 1900, "stream": True}
    with httpx.stream(
        "POST",
        f"{stack.api.url}/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {stack.key_a}"},
    ) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        assert stack.replica.state()["num_requests_running"] == 1
    t0 = time.monotonic()
    wait_idle(stack.replica, timeout_s=3.0)  # 1900 tokens would take far longer
    assert time.monotonic() - t0 < 3.0


def test_non_streamed_request_is_aborted_when_the_client_leaves(stack: Stack) -> None:
    before = aborted_count(stack.replica)
    body = {"model": stack.base, "prompt": "The library", "max_tokens": 1900, "temperature": 0}
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{stack.api.url}/v1/completions",
            json=body,
            timeout=1.5,
            headers={"Authorization": f"Bearer {stack.key_a}"},
        )
    wait_idle(stack.replica, timeout_s=3.0)
    assert time.monotonic() - t0 < 4.5  # 1900 tokens would take far longer
    assert aborted_count(stack.replica) == before + 1


@pytest.fixture(scope="module")
def second(stack: Stack) -> Any:
    """A second replica of the stack's deployment (the last test using it kills it)."""
    replica = Replica(
        stack.model_dir,
        stack.deployment,
        stack.redis_url,
        stack.work,
        env=settings_env(stack.settings, "engine"),
    )
    yield replica
    replica.stop()


def test_cached_prefix_is_routed_to_its_replica_as_predicted(stack: Stack, second: Any) -> None:
    """Two real replicas, the gateway's real router: a prompt that went to replica B (A was
    busy) goes back to B when both are idle, and B's cached-token count is the router's
    prediction, computed with the engine's hash and the block size B reports."""
    first = stack.replica
    prompt = stack.assets.tokenizer.encode(
        "The train left the station on time, crossed the river, " * 3
    )
    salt = f"salt-{uuid.uuid4().hex}"

    async def run() -> tuple[list[Dispatch], list[FinishEvent], dict[str, Any]]:
        redis = Redis.from_url(stack.redis_url)
        http = httpx.AsyncClient()
        client = ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"])
        router = Router(ReplicaRegistry(redis), client, state_ttl_s=0.0)
        dispatches: list[Dispatch] = []
        finishes: list[FinishEvent] = []

        async def routed(rid: str) -> None:
            req = GenerateRequest(
                request_id=rid,
                prompt_token_ids=prompt,
                sampling=SamplingOptions(max_tokens=2, temperature=0),
                cache_salt=salt,
            )
            async for event in router.generate(stack.deployment, req, None, dispatches.append):
                if isinstance(event, FinishEvent):
                    finishes.append(event)

        # Keep the first replica busy (called directly, not through the router).
        long = GenerateRequest(
            request_id=f"busy-{uuid.uuid4().hex}",
            prompt_token_ids=[5, 6, 7],
            sampling=SamplingOptions(max_tokens=1900, ignore_eos=True),
        )
        busy = client.generate(first.url, long)
        await anext(busy)  # it runs
        await routed(f"p1-{uuid.uuid4().hex}")
        await client.abort(first.url, long.request_id)
        await busy.aclose()
        await asyncio.to_thread(wait_idle, first)
        before = await client.state(first.url)
        await routed(f"p2-{uuid.uuid4().hex}")
        after = await client.state(first.url)
        await http.aclose()
        await redis.aclose()
        moved = after.prefix_cache_queries - before.prefix_cache_queries
        return dispatches, finishes, {"first_queries": moved}

    dispatches, finishes, seen = asyncio.run(run())
    urls = [d.replica.url for d in dispatches]
    assert urls == [second.url, second.url], "a cached prefix must pull the request back"
    assert seen["first_queries"] == 0
    block = second.state()["block_size"]
    assert dispatches[0].predicted_cached_tokens == finishes[0].usage.cached_tokens == 0
    expected = max_cached_blocks(len(prompt), block) * block
    assert expected >= 2 * block
    assert dispatches[1].predicted_cached_tokens == expected
    assert finishes[1].usage.cached_tokens == expected


def test_killed_replica_does_not_hang_clients(stack: Stack, second: Any) -> None:
    results: list[str] = []

    def client(i: int) -> None:
        c = stack.client()
        try:
            stream = c.chat.completions.create(
                model=stack.base,
                # Distinct prompts: no cached prefix pulls them all to the first replica.
                messages=[{"role": "user", "content": f"{i} Tell me about the train."}],
                max_tokens=300,
                stream=True,
                temperature=1.0,
                seed=i,
            )
            for _ in stream:
                pass
            results.append("ok")
        except openai.APIError as exc:
            results.append(f"error:{type(exc).__name__}")

    wait_idle(second)
    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while second.state()["num_requests_running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.state()["num_requests_running"] > 0, "the router never used replica 2"
        second.proc.kill()
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads), "a client hung after the replica died"
        assert len(results) == 6
        assert any(r.startswith("error") for r in results)
        # New requests go to the surviving replica (the dead one is skipped, then expires).
        resp = stack.client().chat.completions.create(
            model=stack.base, messages=MESSAGES, max_tokens=2
        )
        assert resp.choices[0].message.content is not None
    finally:
        second.stop()
    wait_idle(stack.replica)


# ---------------------------------------------------------------- adapters served by replicas


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Any:
    proc = start_worker_process(settings_env(stack.settings, "worker"), stack.work / "worker.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def adapters(stack: Stack, worker: Any) -> dict[str, Path]:
    made = {}
    for i in range(5):
        name = f"ad{i}"
        folder = make_peft_adapter(stack.model_dir, stack.work / name, seed=i)
        upload_adapter(stack, stack.key_a, name, folder)
        made[name] = folder
    return made


@pytest.mark.gateway_adapters
def test_uploaded_adapter_is_callable_and_matches_offline(
    stack: Stack, adapters: dict[str, Path]
) -> None:
    folder = adapters["ad0"]
    ids = _chat_prompt_ids(stack, MESSAGES)
    offline_lora = LLM(str(stack.model_dir), max_loras=2, max_lora_rank=16)
    ref = offline_lora.generate(
        [ids], SamplingParams(temperature=0, max_tokens=10), adapters=[str(folder)]
    )[0]
    base_ref = offline_lora.generate([ids], SamplingParams(temperature=0, max_tokens=10))[0]
    assert ref.token_ids != base_ref.token_ids, "the adapter must change the output"
    for model in ("ad0", "ad0:1"):
        resp = stack.client().chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=10, temperature=0
        )
        assert resp.choices[0].message.content == stack.assets.tokenizer.decode(ref.token_ids)
    alias = httpx.post(
        f"{stack.api.url}/v1/adapters/ad0/completions",
        headers={"Authorization": f"Bearer {stack.key_a}"},
        json={"model": "ignored", "prompt": ids, "max_tokens": 10, "temperature": 0},
    )
    assert alias.status_code == 200, alias.text
    assert alias.json()["choices"][0]["text"] == stack.assets.tokenizer.decode(ref.token_ids)
    listed = {m.id: m for m in stack.client().models.list().data}
    assert listed["ad0"].model_extra["parent"] == stack.base
    with pytest.raises(openai.NotFoundError):
        stack.client(stack.key_b).chat.completions.create(model="ad0", messages=MESSAGES)


@pytest.mark.gateway_adapters
def test_20_streams_over_5_adapters_leave_replica_idle(
    stack: Stack, adapters: dict[str, Path]
) -> None:
    run_clients(stack, sorted(adapters))
    state = wait_idle(stack.replica, timeout_s=10.0)
    assert state["resident_adapters"], "the adapters were loaded into device slots"
    metrics = httpx.get(f"{stack.replica.url}/metrics", headers=WIRE_HEADERS, timeout=10).text
    running = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("loraplex:lora_adapter_running_requests{")
    ]
    assert len(running) >= 5 and all(v == 0 for v in running), running
    info = [ln for ln in metrics.splitlines() if ln.startswith("loraplex:lora_requests_info{")]
    assert info and all(
        'running_lora_adapters=""' in ln and 'waiting_lora_adapters=""' in ln for ln in info
    ), info


@pytest.mark.gateway_adapters
def test_same_weights_other_alpha_never_share_caches(stack: Stack, worker: Any) -> None:
    """Two versions with identical weights but another `lora_alpha` are two identities on the
    replica (host tier, device slot, prefix cache): each serves its own scaling."""
    import json
    import shutil

    low = make_peft_adapter(stack.model_dir, stack.work / "alpha-low", seed=21)
    high = stack.work / "alpha-high"
    shutil.copytree(low, high)
    cfg = json.loads((high / "adapter_config.json").read_text())
    cfg["lora_alpha"] = 4 * cfg["lora_alpha"]
    (high / "adapter_config.json").write_text(json.dumps(cfg))
    assert (low / "adapter_model.safetensors").read_bytes() == (
        high / "adapter_model.safetensors"
    ).read_bytes()
    upload_adapter(stack, stack.key_a, "alpha-low", low)
    upload_adapter(stack, stack.key_a, "alpha-high", high)

    ids = _chat_prompt_ids(stack, MESSAGES)
    offline_lora = LLM(str(stack.model_dir), max_loras=2, max_lora_rank=16)
    params = SamplingParams(temperature=0, max_tokens=12)
    refs = {
        name: stack.assets.tokenizer.decode(
            offline_lora.generate([ids], params, adapters=[str(folder)])[0].token_ids
        )
        for name, folder in (("alpha-low", low), ("alpha-high", high))
    }
    assert refs["alpha-low"] != refs["alpha-high"], "alpha must change the output"
    for name in ("alpha-low", "alpha-high", "alpha-low"):  # each loaded while the other is cached
        resp = stack.client().chat.completions.create(
            model=name, messages=MESSAGES, max_tokens=12, temperature=0
        )
        assert resp.choices[0].message.content == refs[name], name

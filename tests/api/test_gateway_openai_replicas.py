"""The OpenAI gateway over several replicas and uploaded adapters: a cached prefix routed to
the replica that holds it, a killed replica, adapters uploaded, validated and served (marked
`gateway_adapters`), and caches never shared across different adapter weights."""

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
from support import openai_stack
from support.gateway_clients import MESSAGES, run_clients, wait_idle
from support.gateway_stack import WIRE_HEADERS, Replica, settings_env
from support.openai_stack import Stack, chat_prompt_ids
from support.peft_adapters import make_peft_adapter
from support.uploads import upload_adapter

from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.gateway.replica_client import ReplicaClient
from loraplex.platform.gateway.replicas import ReplicaRegistry
from loraplex.platform.gateway.router import Dispatch, Router
from loraplex.platform.local_processes import start_worker_process
from loraplex.platform.wire import FinishEvent, GenerateRequest, SamplingOptions
from loraplex.platform.wire.prefix_hash import max_cached_blocks

pytestmark = pytest.mark.timeout(300)
# The running stack, one per module (module-scoped fixtures from tests/support).
stack = openai_stack.stack
offline = openai_stack.offline


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
    ids = chat_prompt_ids(stack, MESSAGES)
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

    ids = chat_prompt_ids(stack, MESSAGES)
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

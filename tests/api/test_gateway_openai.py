"""The OpenAI-compatible gateway end to end, driven by the official `openai` SDK against a
running stack: the API app under uvicorn plus real engine replicas (subprocesses) serving the
demo model, over real PostgreSQL, S3 and Redis.

Tests that need adapters uploaded, validated and served by a replica are marked
`gateway_adapters` (select them alone with `-m gateway_adapters`).
"""

from __future__ import annotations

import json
import time
import uuid

import httpx
import openai
import pytest
from support import openai_stack
from support.gateway_catalog import add_adapter_version
from support.gateway_clients import MESSAGES, aborted_count, run_clients, wait_idle
from support.gateway_stack import WIRE_HEADERS
from support.openai_stack import Stack, chat_prompt_ids

from loraplex.platform.db.session import session_scope
from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.services.api_keys import create_api_key, revoke_api_key
from loraplex.platform.services.base_models import register_base_model

pytestmark = pytest.mark.timeout(300)
# The running stack, one per module (module-scoped fixtures from tests/support).
stack = openai_stack.stack
offline = openai_stack.offline


def test_chat_matches_offline_engine_with_logprobs(stack: Stack, offline: LLM) -> None:
    resp = stack.client().chat.completions.create(
        model=stack.base,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    ids = chat_prompt_ids(stack, MESSAGES)
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
    ids = chat_prompt_ids(stack, long)
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
    hostile = [
        (b"[" * 100_000, 400, "invalid_json"),  # deeper than Python's parser goes
        (b'{"a":' * 50_000, 400, "invalid_json"),
        (json.dumps({"model": "a\x00b", "messages": MESSAGES}).encode(), 400, "invalid_name"),
        (json.dumps({"model": stack.base, "messages": "x" * 10}).encode(), 400, None),
        (json.dumps({"model": stack.base, "messages": MESSAGES, "n": 10**9}).encode(), 400, None),
        (b"x" * (stack.settings.max_request_bytes + 1), 413, "request_too_large"),
    ]
    for body, status, code in hostile:
        r = httpx.post(
            f"{stack.api.url}/v1/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {stack.key_a}"},
            timeout=60,
        )
        assert r.status_code == status, (body[:40], r.status_code, r.text[:200])
        assert code is None or r.json()["error"]["code"] == code, r.text[:200]


def test_models_listing(stack: Stack) -> None:
    models = stack.client().models.list()
    ids = {m.id for m in models.data}
    assert stack.base in ids
    base = next(m for m in models.data if m.id == stack.base)
    assert base.model_extra["deployments"] == [
        {
            "name": stack.deployment,
            "quantization": {"weights": "fp32", "kv_cache": "auto"},
            "deterministic": False,  # the deployment option, shown to callers
            "speculative": None,  # speculative decoding (issue 25): off
        }
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

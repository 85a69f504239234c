"""A new adapter version is warmed into the replica's host tier when it turns ready (issue
29): the validation worker announces it, the gateway asks the replica its router would pick,
and the replica fetches it before any request names it; the first request then pays no
fetch and answers as the offline engine does. Real stack: PostgreSQL, SeaweedFS, Redis, a
Celery worker, the API and an engine replica, each in its own process."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from support import openai_stack
from support.gateway_clients import MESSAGES
from support.gateway_stack import WIRE_HEADERS, settings_env
from support.openai_stack import Stack, chat_prompt_ids
from support.peft_adapters import make_peft_adapter
from support.uploads import upload_adapter

from loraplex.adapters.identity import adapter_ref_key
from loraplex.platform.db.models import Adapter, AdapterVersion
from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.local_processes import start_worker_process

pytestmark = pytest.mark.timeout(300)
stack = openai_stack.stack


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Any:
    proc = start_worker_process(settings_env(stack.settings, "worker"), stack.work / "worker.log")
    yield proc
    proc.stop()


def _fetches(stack: Stack, key: str) -> list[float]:
    """The replica's `lora_adapter_fetch_seconds` for `key` (empty: never fetched)."""
    text = httpx.get(f"{stack.replica.url}/metrics", headers=WIRE_HEADERS, timeout=10).text
    pattern = rf'^\S*lora_adapter_fetch_seconds\{{[^}}]*"{key}"[^}}]*\}} (\S+)$'
    return [float(v) for v in re.findall(pattern, text, flags=re.M)]


def _version_key(stack: Stack, name: str) -> str:
    with stack.factory() as s:
        v = s.execute(
            select(AdapterVersion.sha256, AdapterVersion.config_sha256)
            .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
            .where(Adapter.name == name)
        ).one()
    return adapter_ref_key(v[0], v[1])


def test_a_ready_version_is_on_the_replica_before_its_first_request(
    stack: Stack, worker: Any
) -> None:
    folder = make_peft_adapter(stack.model_dir, stack.work / "warm0", seed=11)
    upload_adapter(stack, stack.key_a, "warm0", folder)
    key = _version_key(stack, "warm0")
    deadline = time.monotonic() + 20
    while not _fetches(stack, key) and time.monotonic() < deadline:
        time.sleep(0.2)
    fetched = _fetches(stack, key)
    assert fetched, "the replica did not fetch the ready version before a request named it"

    ids = chat_prompt_ids(stack, MESSAGES)
    offline = LLM(str(stack.model_dir), max_loras=2, max_lora_rank=16)
    ref = offline.generate(
        [ids], SamplingParams(temperature=0, max_tokens=8), adapters=[str(Path(folder))]
    )[0]
    resp = stack.client().chat.completions.create(
        model="warm0", messages=MESSAGES, max_tokens=8, temperature=0
    )
    assert resp.choices[0].message.content == stack.assets.tokenizer.decode(ref.token_ids)
    assert _fetches(stack, key) == fetched  # the first request fetched nothing again


def test_the_replica_refuses_a_malformed_warm(stack: Stack) -> None:
    url = f"{stack.replica.url}/adapters/warm"
    bad = httpx.post(url, json={"adapter": {"sha256": "x"}}, headers=WIRE_HEADERS, timeout=10)
    assert bad.status_code in (400, 422) and "error" in bad.json()
    anonymous = httpx.post(url, json={}, timeout=10)
    assert anonymous.status_code == 401

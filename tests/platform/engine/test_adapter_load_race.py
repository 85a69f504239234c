"""The adapter-load race of issue 23 from the replica's side, and reads of memory nobody wrote.

The flaky gateway test (`test_gateway_prequantized.py::...[awq-awq]`) answered another token now
and then for a request whose adapter the replica had not loaded yet. These tests pin what would
have to break for that to happen, each on today's code:

* fresh engines driven the way a replica drives them (`EngineLoop`: every step on asyncio's
  worker threads, the gateway's warm at upload racing the first request, or the request alone)
  answer every time exactly as the offline engine does with the adapter from its directory
  (tokens and the bits of every sampled logits row); `LORAPLEX_RACE_STRESS=200` runs 200;
* no kernel reads memory it did not write: a KV cache filled with NaN before the first request,
  and a fresh process whose every host allocation is filled with a byte pattern
  (`MALLOC_PERTURB_`, with mmap off so big buffers come from the heap too), give the same bits;
* only the thread running a step touches device-side adapter state (pool rows, ref counts, the
  native kernel's pointer structs); the fetch thread only inserts into the host tier;
* a bf16 matmul row reads only its own inputs (the lead left: a oneDNN AMX bug, see the last
  test; this CPU has no AMX, so it checks the CPU the suite runs on).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.logit_spy import record_sampled_logits  # noqa: E402
from support.peft_adapters import make_adapter, make_peft_adapter  # noqa: E402

from loraplex.adapters.device_pool import DevicePool  # noqa: E402
from loraplex.adapters.host_cache import HostCache  # noqa: E402
from loraplex.adapters.kernels.lora_cpu import NativeLora  # noqa: E402
from loraplex.adapters.targets import resolve_config_targets  # noqa: E402
from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.engine_loop import EngineLoop, PendingAdd  # noqa: E402
from loraplex.platform.engine.lora import AdapterRef  # noqa: E402
from loraplex.platform.wire import GenerateRequest  # noqa: E402

FILES = ("adapter_config.json", "adapter_model.safetensors")
# The fresh-replica stress test's engine count per base (`LORAPLEX_RACE_STRESS=200`: 200).
STRESS_ENGINES = int(os.environ.get("LORAPLEX_RACE_STRESS", "4"))
# The gateway test's sizes (two int4 groups per input) and its chat prompt's token count.
AWQ_SIZES = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2
)
PROMPT = [1, 45, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69, 73, 77, 81, 85]
MAX_TOKENS = 10
# How each fresh engine meets its adapter: the request alone (the fetch starts at admission),
# the gateway's warm at upload with the request right behind it, or the warm finished first.
SCHEDULES = ("request", "warm_then_request", "warmed")


def _engine(base: str, quantization: str | None) -> LLM:
    extra: dict[str, Any] = {} if quantization is None else {"quantization": quantization}
    return LLM(base, dtype="bfloat16", max_loras=2, max_lora_rank=16, **extra)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[str, Path, Any]]:
    """`worlds(kind)`: (base dir, adapter dir, quantization) for "awq" (the flaky gateway test's
    AutoAWQ-packed base and adapter) or "bf16" (a tiny Llama, an all-linear adapter)."""
    made: dict[str, tuple[str, Path, Any]] = {}

    def build(kind: str) -> tuple[str, Path, Any]:
        if kind in made:
            return made[kind]
        if kind == "awq":
            from support.awq_gptq_checkpoints import libraries_installed, save_awq_gptq

            if not libraries_installed():
                pytest.skip("AutoAWQ (the AWQ packer) is not installed")
            plain = tmp_path_factory.mktemp("plain")
            hf = save_tiny_model(plain, "llama", seed=4, **AWQ_SIZES)
            quant = tmp_path_factory.mktemp("awq")
            save_awq_gptq(hf, plain, quant, "awq", seed=5)
            folder = make_peft_adapter(plain, tmp_path_factory.mktemp("awq_ad"), seed=3)
            made[kind] = (str(quant), folder, "awq")
        else:
            base = tmp_path_factory.mktemp("bf16")
            hf = save_tiny_model(base, "llama", seed=7)
            folder = make_adapter(hf, tmp_path_factory.mktemp("ad"), seed=11, r=8,
                                  lora_alpha=16, target_modules="all-linear")  # fmt: skip
            made[kind] = (str(base), folder, None)
        return made[kind]

    return build


@pytest.fixture
def upload(s3_client, s3_bucket: str, s3_prefix: str, s3_storage):  # noqa: ANN001, ANN201
    """Put an adapter's two files in the test bucket; its prefix and the reader a replica uses."""
    from loraplex.loader.object_store import ObjectStore

    def put(folder: Path) -> tuple[str, ObjectStore]:
        for name in FILES:
            body = (folder / name).read_bytes()
            s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + name, Body=body)
        return s3_prefix, ObjectStore(s3_storage)

    return put


def _ref(llm: LLM, folder: Path, prefix: str) -> AdapterRef:
    """The adapter as the gateway hands it to a replica (object prefix, sha256, targets)."""
    config = (folder / FILES[0]).read_bytes()
    sha = hashlib.sha256((folder / FILES[1]).read_bytes()).hexdigest()
    targets = resolve_config_targets(config, llm.core.model.hf_config).to_json()
    return AdapterRef(object_prefix=prefix, sha256=sha, tenant="t1", targets=targets)


def _bits(rows: list[torch.Tensor]) -> list[bytes]:
    return [r.numpy().tobytes() for r in rows]


def _offline(llm: LLM, folder: Path) -> tuple[list[int], list[bytes]]:
    """The offline engine's answer with the adapter read from its directory, and its bits."""
    rows = record_sampled_logits(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = llm.generate([PROMPT], params, adapters=[str(folder)])[0].outputs[0].token_ids
    return list(out), _bits(next(iter(rows.values())))


async def _serve(llm: LLM, ref: AdapterRef, schedule: str) -> list[int]:
    """One request through the replica's engine loop, its adapter met as `schedule` says."""
    loop = EngineLoop(llm.core)
    loop.start()
    warm: asyncio.Future | None = None
    try:
        if schedule != "request":
            warm = asyncio.ensure_future(loop.warm(ref))
        if schedule == "warmed":
            await warm
            while ref.key not in llm.core.lora_runtime.host:
                await asyncio.sleep(0.002)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        queue = await loop.add(
            PendingAdd(
                GenerateRequest(request_id="r", prompt_token_ids=list(PROMPT), adapter=ref), params
            )
        )
        out: list[int] = []
        while True:
            delta = await asyncio.wait_for(queue.get(), 120)
            if isinstance(delta, BaseException):
                raise delta
            out.extend(delta.new_token_ids)
            if delta.finished:
                return out
    finally:
        if warm is not None:
            await warm
        await loop.stop()


@pytest.mark.parametrize("kind", ["awq", "bf16"])
def test_fresh_replicas_answer_a_cold_adapter_like_the_offline_engine(
    worlds, upload, kind: str
) -> None:
    """Fresh engines driven as a replica drives them, the first request of each naming a
    not-yet-fetched adapter: every answer, bit for bit, the offline engine's."""
    base, folder, quantization = worlds(kind)
    prefix, store = upload(folder)
    want_tokens, want_bits = _offline(_engine(base, quantization), folder)
    for i in range(STRESS_ENGINES):
        llm = _engine(base, quantization)
        runtime = llm.core.lora_runtime
        runtime.fetcher.object_store = store
        rows = record_sampled_logits(llm)
        schedule = SCHEDULES[i % len(SCHEDULES)]
        tokens = asyncio.run(_serve(llm, _ref(llm, folder, prefix), schedule))
        assert tokens == want_tokens, f"engine {i} ({schedule})"
        assert _bits(rows["r"]) == want_bits, f"engine {i} ({schedule}): logits bits differ"
        runtime.detach()


def test_a_kv_cache_full_of_nan_changes_no_bit(worlds, upload) -> None:
    """Every KV slot NaN before the first request (the native decode attention and the KV
    write on the AWQ base): no kernel reads a slot it has not written, so the bits stay."""
    base, folder, quantization = worlds("awq")
    prefix, store = upload(folder)
    want_tokens, want_bits = _offline(_engine(base, quantization), folder)
    llm = _engine(base, quantization)
    caches = [
        m.kv_cache for m in llm.core.model.modules() if getattr(m, "kv_cache", None) is not None
    ]
    assert caches
    for cache in caches:
        cache.fill_(float("nan"))
    llm.core.lora_runtime.fetcher.object_store = store
    rows = record_sampled_logits(llm)
    tokens = asyncio.run(_serve(llm, _ref(llm, folder, prefix), "request"))
    assert tokens == want_tokens
    assert _bits(rows["r"]) == want_bits


CHILD = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from support.logit_spy import record_sampled_logits
import torch
from loraplex.platform.engine import LLM, SamplingParams
assert bool((torch.empty(1 << 22, dtype=torch.uint8) == 0x55).all()), "MALLOC_PERTURB_ is off"
base, folder, quantization, prompt, n = json.loads(sys.argv[2])
llm = LLM(base, dtype="bfloat16", max_loras=2, max_lora_rank=16, quantization=quantization)
rows = record_sampled_logits(llm)
params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
out = llm.generate([prompt], params, adapters=[folder])[0].outputs[0].token_ids
bits = hashlib.sha256(b"".join(r.numpy().tobytes() for r in next(iter(rows.values()))))
print("ANSWER", json.dumps([list(out), bits.hexdigest()]))
"""


def test_host_memory_filled_with_a_pattern_changes_no_bit(worlds) -> None:
    """A fresh process whose every malloc returns memory filled with 0x55 (glibc's
    MALLOC_PERTURB_; mmap off, so large tensors come from the heap too): a kernel reading an
    uninitialised host buffer (scratch, padding rows, a torch.empty output) would move bits."""
    base, folder, quantization = worlds("awq")
    want_tokens, want_bits = _offline(_engine(base, quantization), folder)
    want = hashlib.sha256(b"".join(want_bits)).hexdigest()
    env = dict(os.environ, MALLOC_PERTURB_="170", MALLOC_MMAP_THRESHOLD_=str(1 << 32))
    args = json.dumps([base, str(folder), quantization, PROMPT, MAX_TOKENS])
    tests_dir = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, tests_dir, args],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("ANSWER ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    tokens, digest = json.loads(lines[-1].removeprefix("ANSWER "))
    assert tokens == want_tokens
    assert digest == want


class ThreadLog:
    """Which thread did what: every call of the wrapped methods, and whether its thread was
    running `EngineCore.step` at the time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, bool]] = []
        self._in_step = threading.local()
        self._patch = monkeypatch

    def wrap(self, owner: Any, name: str) -> None:  # noqa: ANN401
        inner = getattr(owner, name)

        def spy(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            step = getattr(self._in_step, "on", False)
            self.calls.append((name, threading.current_thread().name, step))
            return inner(*args, **kwargs)

        self._patch.setattr(owner, name, spy)

    def wrap_step(self, core: Any) -> None:  # noqa: ANN401
        inner = core.step

        def step() -> Any:  # noqa: ANN401
            self._in_step.on = True
            try:
                return inner()
            finally:
                self._in_step.on = False

        core.step = step


def test_only_the_stepping_thread_touches_device_adapter_state(
    worlds, upload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pool rows, ref counts and the native kernel's pointer structs change only inside a step
    (on whichever worker thread runs it); the fetch thread only inserts into the host tier."""
    base, folder, quantization = worlds("bf16")
    prefix, store = upload(folder)
    log = ThreadLog(monkeypatch)
    for name in ("load", "evict", "acquire", "release", "_compact"):
        log.wrap(DevicePool, name)
    log.wrap(NativeLora, "linear")  # the native kernel's pointer structs
    log.wrap(HostCache, "put")
    for schedule in SCHEDULES:
        llm = _engine(base, quantization)
        llm.core.lora_runtime.fetcher.object_store = store
        log.wrap_step(llm.core)
        asyncio.run(_serve(llm, _ref(llm, folder, prefix), schedule))
        llm.core.lora_runtime.detach()
    device = [c for c in log.calls if c[0] != "put"]
    assert {c[0] for c in device} >= {"load", "acquire", "release", "linear"}
    assert all(in_step for _, _, in_step in device), [c for c in device if not c[2]]
    puts = [c for c in log.calls if c[0] == "put"]
    assert len(puts) == len(SCHEDULES)
    assert all(thread.startswith("lora-fetch") and not in_step for _, thread, in_step in puts)


@pytest.mark.parametrize("k", [33, 45, 77])
def test_a_bf16_matmul_row_reads_only_its_own_inputs(k: int) -> None:
    """The lead the race left (issue 23): oneDNN's AMX bf16 brgemm reads a K tail (K > 32,
    K % 32 != 0) past the row's valid columns and relies on B's zero padding, so NaN in other
    rows leaks into clean ones (oneDNN issue 5717, fixed by PR 5723, after the oneDNN that
    torch bundles). The flaky gateway test ran on an AMX CPU with a 45-token prompt; this CPU
    has no AMX. Here a clean row beside NaN rows, through torch's bf16 bmm and the engine's
    prefill SDPA (45 keys, GQA), must come out finite and equal (to bf16 rounding) to the same
    row computed alone."""
    g = torch.Generator().manual_seed(k)
    a = torch.randn(2, 16, k, generator=g).to(torch.bfloat16)
    b = torch.randn(2, k, 64, generator=g).to(torch.bfloat16)
    dirty = a.clone()
    dirty[:, 1:] = float("nan")  # every row but row 0 is NaN
    out = torch.bmm(dirty, b)
    alone = torch.bmm(a[:, :1].contiguous(), b)
    assert torch.isfinite(out[:, 0]).all()
    assert torch.allclose(out[:, 0].float(), alone[:, 0].float(), atol=0.1, rtol=0)

    n, hq, hkv, d = k, 4, 2, 64
    q = torch.randn(hq, n, d, generator=g).to(torch.bfloat16)
    key = torch.randn(hkv, n, d, generator=g).to(torch.bfloat16)
    val = torch.randn(hkv, n, d, generator=g).to(torch.bfloat16)
    mask = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    nan_q = q.clone()
    nan_q[:, 1:] = float("nan")  # queries are independent rows: row 0 must not see these
    sdpa = torch.nn.functional.scaled_dot_product_attention
    got = sdpa(nan_q, key, val, attn_mask=mask, scale=0.125, enable_gqa=True)[:, 0]
    want = sdpa(q[:, :1], key, val, attn_mask=mask[:1], scale=0.125, enable_gqa=True)[:, 0]
    assert torch.isfinite(got).all()
    assert torch.allclose(got.float(), want.float(), atol=5e-2, rtol=0)
    # a call that leaves NaN in every scratch buffer, then the clean call again: no stale read
    sdpa(nan_q, key * float("nan"), val * float("nan"), attn_mask=mask, enable_gqa=True)
    again = sdpa(q, key, val, attn_mask=mask, scale=0.125, enable_gqa=True)
    ref = sdpa(q.float(), key.float(), val.float(), attn_mask=mask, scale=0.125, enable_gqa=True)
    assert torch.isfinite(again).all()
    assert torch.allclose(again.float(), ref, atol=5e-2, rtol=0)

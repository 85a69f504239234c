"""The background adapter fetch against the engine's steps (issue 23).

A request whose adapter is not fetched yet waits while the fetch thread reads, parses and
inserts it; the engine keeps stepping other requests meanwhile. Here the fetch thread is held
at each point where it touches shared state (`fetcher.FETCH_STAGES`: the object-store read,
the parse into torch tensors, the host-tier insert, the end of the fetch) and let go either
between steps (the reference), in the middle of a forward with the engine parked there, or at
the start of a forward so that its work runs while the layers compute. The same schedule must
give the same bits whatever the interleaving, for the request decoding beside the fetch and
for the request whose first forward uses the freshly fetched adapter; and torch or native work
on another thread during a forward must not change them either.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.logit_spy import record_sampled_logits  # noqa: E402
from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.adapters.targets import resolve_config_targets  # noqa: E402
from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.lora import AdapterRef  # noqa: E402
from loraplex.platform.engine.lora.fetcher import FETCH_STAGES  # noqa: E402

GREEDY = dict(temperature=0.0, ignore_eos=True)
FILES = ("adapter_config.json", "adapter_model.safetensors")
# `LORAPLEX_RACE_STRESS=200` runs the fresh-engine stress test with 200 engines (CI: 3).
STRESS_ENGINES = int(os.environ.get("LORAPLEX_RACE_STRESS", "3"))
WAIT_S = 30
AWQ_SIZES = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A tiny Llama and an all-linear rank-8 adapter over it."""
    base_dir = tmp_path_factory.mktemp("base")
    hf = save_tiny_model(base_dir, "llama", seed=7)
    folder = make_adapter(
        hf, tmp_path_factory.mktemp("ad"), seed=11, r=8, lora_alpha=16, target_modules="all-linear"
    )
    return str(base_dir), folder


@pytest.fixture(scope="module")
def awq_world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path] | None:
    """The issue's case: an AutoAWQ-packed base (the gateway test's sizes: two int4 groups
    per input) and an adapter over it (None without AutoAWQ)."""
    from support.awq_gptq_checkpoints import libraries_installed, save_awq_gptq

    if not libraries_installed():
        return None
    plain = tmp_path_factory.mktemp("plain")
    hf = save_tiny_model(plain, "llama", seed=4, **AWQ_SIZES)
    quant = tmp_path_factory.mktemp("awq")
    save_awq_gptq(hf, plain, quant, "awq", seed=5)
    folder = make_adapter(
        hf,
        tmp_path_factory.mktemp("awq_ad"),
        seed=3,
        r=8,
        lora_alpha=16,
        target_modules="all-linear",
    )
    return str(quant), folder


@pytest.fixture
def upload(s3_client, s3_bucket: str, s3_prefix: str, s3_storage):  # noqa: ANN001
    """Put an adapter's two files in the test bucket; the prefix and the reader a replica uses."""
    from loraplex.loader.object_store import ObjectStore

    def put(folder: Path):  # noqa: ANN202
        for name in FILES:
            body = (folder / name).read_bytes()
            s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + name, Body=body)
        return s3_prefix, ObjectStore(s3_storage)

    return put


def _engine(base_dir: str, dtype: str, **extra: object) -> LLM:
    return LLM(
        base_dir, dtype=dtype, max_loras=2, max_lora_rank=16, block_size=4,
        max_num_batched_tokens=64, max_num_seqs=4, **extra,
    )  # fmt: skip


def _ref(llm: LLM, folder: Path, prefix: str) -> AdapterRef:
    """The adapter as the gateway hands it to a replica (object prefix, sha256, targets)."""
    config = (folder / FILES[0]).read_bytes()
    sha = hashlib.sha256((folder / FILES[1]).read_bytes()).hexdigest()
    targets = resolve_config_targets(config, llm.core.model.hf_config).to_json()
    return AdapterRef(object_prefix=prefix, sha256=sha, tenant="t1", targets=targets)


class StageGate:
    """Holds the fetch thread at every probe stage until `advance` or `release` lets it on."""

    def __init__(self) -> None:
        self.stages: list[str] = []
        self._arrived = threading.Semaphore(0)
        self._go = threading.Semaphore(0)
        self._finished = threading.Event()

    def probe(self, stage: str, key: str) -> None:
        """The fetcher's probe (fetch thread): announce the stage, wait to be let on."""
        self.stages.append(stage)
        self._arrived.release()
        if not self._go.acquire(timeout=WAIT_S):
            raise TimeoutError(f"the fetch was held at {stage} for {WAIT_S} s")
        if stage == FETCH_STAGES[-1]:
            self._finished.set()

    @property
    def done(self) -> bool:
        """Whether the fetch has passed its last stage."""
        return self._finished.is_set()

    def release(self) -> None:
        """Wait until the fetch holds at its next stage, then let it run on (no wait after)."""
        if self.done:
            return
        if not self._arrived.acquire(timeout=WAIT_S):
            raise TimeoutError("the fetch thread never reached its next stage")
        self._go.release()

    def settle(self, fetcher) -> None:  # noqa: ANN001
        """Wait until the released fetch holds again, or has finished altogether."""
        deadline = threading.Event()
        for _ in range(WAIT_S * 1000):
            if self.done:
                for fut in list(fetcher._fetches.values()):
                    fut.result(timeout=WAIT_S)
                return
            if self._arrived.acquire(timeout=0.001):
                self._arrived.release()  # still to be consumed by the next `release`
                return
            deadline.wait(0)
        raise TimeoutError("the fetch neither held again nor finished")

    def advance(self, fetcher) -> None:  # noqa: ANN001
        """Let the fetch run exactly one stage, and wait for it to get there."""
        if not self.done:
            self.release()
            self.settle(fetcher)


def _layer_hooks(llm: LLM, before: Callable[[], None], after: Callable[[], None]) -> None:
    """`before` at the start of the first decoder layer, `after` at the end of the last one."""
    layers = llm.core.model.model.layers
    layers[0].register_forward_pre_hook(lambda *_: before())
    layers[-1].register_forward_hook(lambda *_: after())


def _other_thread_work(dtype: torch.dtype) -> Callable[[], None]:
    """Torch and native-kernel work another thread runs during a forward: a GEMM and an
    elementwise op on torch's OpenMP pool, a native argmax, a KV write and decode attention on
    buffers of its own, and torch's thread-count setting read back and set to what it was."""
    from loraplex.platform.engine.greedy_cpu import native_argmax, native_argmax_available
    from loraplex.platform.engine.layers.paged_attention_cpu import (
        native_decode_attention,
        native_decode_available,
        native_write_kv,
    )

    g = torch.Generator().manual_seed(1)
    a = torch.randn(96, 256, generator=g).to(dtype)
    b = torch.randn(256, 384, generator=g).to(dtype)
    cache = torch.zeros(2, 4, 4, 2, 32, dtype=dtype)
    k = torch.randn(8, 2, 32, generator=g).to(dtype)
    q = torch.randn(2, 4, 32, generator=g).to(dtype)
    slots = torch.arange(8, dtype=torch.int64)
    tables = torch.tensor([[0, 1], [0, 1]], dtype=torch.int32)
    lens = torch.tensor([8, 5], dtype=torch.int32)

    def work() -> None:
        (a @ b).relu_().sum()
        if native_argmax_available(a):
            native_argmax(a)
        if native_decode_available(q, cache):
            native_write_kv(cache, k, k, slots)
            native_decode_attention(q, cache, tables, lens, 8, 0.17)
        torch.set_num_threads(torch.get_num_threads())

    return work


def _run(
    llm: LLM,
    ref: AdapterRef,
    store,
    mode: str,
    prompts: list[list[int]],  # noqa: ANN001
) -> tuple[dict[str, list[torch.Tensor]], dict[str, list[int]], list[str]]:
    """One base request decoding while the other request's adapter is fetched stage by stage
    (`mode` says where each stage runs); its sampled logits and tokens, and the stages seen."""
    core = llm.core
    fetcher = core.lora_runtime.fetcher
    fetcher.object_store = store
    gate = StageGate()
    fetcher.probe = gate.probe
    rows = record_sampled_logits(llm)
    helper: list[threading.Thread] = []
    work = _other_thread_work(llm.core.dtype)

    def start() -> None:
        if mode == "overlap":  # the stage's work runs while the layers compute
            gate.release()
        elif mode == "threads":  # torch and native work on another thread meanwhile
            t = threading.Thread(target=lambda: [work() for _ in range(3)])
            t.start()
            helper.append(t)
        elif mode == "parked":  # the stage runs with the engine parked mid-forward
            gate.advance(fetcher)

    def end() -> None:
        if mode == "overlap":
            gate.settle(fetcher)
        while helper:
            helper.pop().join(WAIT_S)

    _layer_hooks(llm, start, end)
    params = SamplingParams(max_tokens=8, **GREEDY)
    reqs = {
        "base": core.add_request(prompts[0], params, "base"),
        "lora": core.add_request(prompts[1], params, "lora", adapter=ref),
    }
    while core.has_unfinished():
        core.step()
        if mode in ("between", "threads"):
            gate.advance(fetcher)
    fetcher.probe = None
    return rows, {k: r.output_token_ids for k, r in reqs.items()}, gate.stages


def _bits(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    return [r.view(torch.int32) for r in rows]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_fetch_held_at_each_shared_point_never_changes_a_bit(world, upload, dtype: str) -> None:
    """Every fetch stage run between steps, parked mid-forward, or overlapping the layers (and
    other-thread torch/native work during forwards): the same bits for both requests."""
    base_dir, folder = world
    prefix, store = upload(folder)
    prompts = [[5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45], [7, 3, 11, 19, 23, 2, 31, 29, 8]]
    results = {}
    for mode in ("between", "parked", "overlap", "threads"):
        llm = _engine(base_dir, dtype)
        results[mode] = _run(llm, _ref(llm, folder, prefix), store, mode, prompts)
        llm.core.lora_runtime.detach()
    want_rows, want_tokens, want_stages = results["between"]
    assert want_stages == list(FETCH_STAGES)
    assert len(want_rows["lora"]) == 8 and len(want_rows["base"]) == 8
    for mode, (rows, tokens, stages) in results.items():
        assert stages == list(FETCH_STAGES), mode
        assert tokens == want_tokens, mode
        for rid in ("base", "lora"):
            for i, (got, want) in enumerate(
                zip(_bits(rows[rid]), _bits(want_rows[rid]), strict=True)
            ):
                assert torch.equal(got, want), f"{mode}: {rid} step {i} differs"


@pytest.mark.parametrize("base", ["bf16", "awq"])
def test_fresh_engines_answer_a_cold_adapter_like_a_resident_one(
    world, awq_world, upload, base: str
) -> None:
    """Fresh engines, the first request of each naming a not-yet-fetched adapter: every
    answer (tokens and logits bits) equal to the same request once the adapter is resident
    (a bf16 base, and the AWQ base of the issue's flaky gateway test)."""
    base_dir, folder = world
    extra: dict[str, object] = {}
    if base == "awq":
        if awq_world is None:
            pytest.skip("AutoAWQ (the AWQ packer) is not installed")
        (base_dir, folder), extra = awq_world, {"quantization": "awq"}
    prefix, store = upload(folder)
    prompt = [4, 8, 15, 16, 23, 42, 7, 9, 30, 2, 6, 11]
    params = SamplingParams(max_tokens=10, **GREEDY)

    def once(llm: LLM, ref: AdapterRef) -> tuple[list[int], list[torch.Tensor]]:
        rows = record_sampled_logits(llm)
        out = llm.generate([prompt], params, adapters=[ref])[0].outputs[0].token_ids
        return out, _bits(next(iter(rows.values())))

    llm = _engine(base_dir, "bfloat16", **extra)
    llm.core.lora_runtime.fetcher.object_store = store
    ref = _ref(llm, folder, prefix)
    once(llm, ref)  # fetched now; the next request finds it resident
    want_tokens, want_bits = once(llm, ref)
    assert llm.core.lora_runtime.resident_adapters == [ref.key]
    for i in range(STRESS_ENGINES):
        fresh = _engine(base_dir, "bfloat16", **extra)
        fresh.core.lora_runtime.fetcher.object_store = store
        tokens, bits = once(fresh, ref)
        assert tokens == want_tokens, f"engine {i}"
        assert all(torch.equal(g, w) for g, w in zip(bits, want_bits, strict=True)), f"engine {i}"
        fresh.core.lora_runtime.detach()

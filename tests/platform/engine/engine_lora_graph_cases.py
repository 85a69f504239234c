"""Cases for the graph-static LoRA decode step under TRITON_INTERPRET=1 (CPU).

Run by test_engine_lora_decode_graphs.py in a fresh interpreter with TRITON_INTERPRET=1 (Triton
reads it when its kernels are defined). The step function that `capture_decode_graphs` hands to
the CUDA graph capture is run eagerly over padded static buffers, with the graph-static Triton
shrink/expand in the interpreter, and compared with the normal eager LoRA decode (torch path).
"""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1 (see test_engine_lora_decode_graphs.py)")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")
pytest.importorskip("peft")

from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.cuda_graphs import CudaGraphRunner  # noqa: E402
from loraplex.platform.engine.decode_graphs import (  # noqa: E402
    _replay,
    decode_graph_inputs,
    load_static_lora,
    make_decode_step,
    static_lora_meta,
)

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
ADAPTERS = {
    "r4_qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "r8_all": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    "r16_rslora_attn": dict(r=16, lora_alpha=16, use_rslora=True, target_modules=ATTN),
    "r12_mlp_pattern": dict(
        r=12,
        lora_alpha=6,
        target_modules=["gate_proj", "up_proj", "down_proj"],
        rank_pattern={"down_proj": 5},
    ),  # fmt: skip
}
# batch order of the decode step: an adapter split over two runs, base rows between
ORDER = ["r4_qv", None, "r8_all", "r4_qv", "r16_rslora_attn", None, "r12_mlp_pattern"]
PROMPT_LENS = [9, 5, 13, 3, 7, 11, 6]


@pytest.fixture(scope="module")
def decode_ready(tmp_path_factory):
    """An engine (CPU, LoRA on) whose requests finished prefill; the next decode step's requests."""
    base = tmp_path_factory.mktemp("base")
    hf = save_tiny_model(base, "llama", seed=3, with_tokenizer=False)
    dirs = {
        name: str(make_adapter(hf, tmp_path_factory.mktemp(name), seed=40 + i, **kw))
        for i, (name, kw) in enumerate(ADAPTERS.items())
    }
    llm = LLM(str(base), max_loras=4, max_lora_rank=16, block_size=4, max_num_seqs=8)
    core = llm.core
    gen = torch.Generator().manual_seed(7)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for i, (name, n) in enumerate(zip(ORDER, PROMPT_LENS, strict=True)):
        prompt = torch.randint(3, 128, (n,), generator=gen).tolist()
        core.add_request(prompt, params, f"r{i}", dirs[name] if name else None)
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step()
    sched = core.scheduler.schedule()
    by_id = {s.request.request_id: s.request for s in sched.scheduled}
    assert all(s.num_tokens == 1 for s in sched.scheduled) and len(by_id) == len(ORDER)
    return core, [by_id[f"r{i}"] for i in range(len(ORDER))]


def _static_step(runner, static, b):
    step = make_decode_step(runner, static)  # the function capture_decode_graphs captures
    return step(
        runner.decode_input_ids[:b],
        runner.decode_positions[:b],
        runner.decode_slot_mapping[:b],
        runner.decode_seq_lens[:b],
        runner.decode_context_lens[:b],
        runner.decode_block_tables[:b],
    )


@pytest.mark.parametrize("b", [7, 8])
@torch.inference_mode()
def test_graph_static_step_equals_eager_lora_decode(decode_ready, b):
    core, requests = decode_ready
    runner, rt = core.runner, core.lora_runtime
    n = len(requests)
    meta = rt.prepare_step(requests, [1] * n)
    assert meta.num_active == 4 and len(meta.groups[0].runs) == 2  # r4_qv in two runs

    runner.lora_metadata = meta  # the normal eager LoRA decode (torch path on CPU)
    runner.prepare_decode_inputs(requests, n)
    want = runner.run_decode_step(n).clone()
    runner.lora_metadata = None
    base = runner.run_decode_step(n).clone()

    static = static_lora_meta(runner, 8)
    static.active_slots.fill_(3)  # stale contents from an earlier step must not leak
    static.token_slot.fill_(2)
    runner.lora_metadata = meta
    runner.prepare_decode_inputs(requests, b)  # padded rows: slot -1, seq_len 1
    assert load_static_lora(static, meta, b)
    assert (static.token_slot[n:b] == -1).all()
    got = _static_step(runner, static, b)
    assert got.shape[0] == b
    err = (got[:n] - want).abs().max().item()
    assert err < 1e-4, f"graph-static LoRA step differs from eager by {err:.2e}"
    for i, name in enumerate(ORDER):  # the adapters really act, base rows stay base
        diff = (want[i] - base[i]).abs().max().item()
        assert (diff > 1e-2) if name else (diff < 1e-5), (name, diff)

    runner.lora_metadata = None  # a base-only step replays the same graph, every slot -1
    assert load_static_lora(static, None, b)
    assert (static.active_slots == -1).all()
    got_base = _static_step(runner, static, b)
    assert (got_base[:n] - base).abs().max().item() < 1e-4


@torch.inference_mode()
def test_replay_entry_loads_the_step_metadata(decode_ready):
    """The `decode_graphs` entry (copy metadata in, run): with nothing captured (CPU) the
    loader's runner runs the same step eagerly on the padded buffers."""
    core, requests = decode_ready
    runner, rt = core.runner, core.lora_runtime
    n, b = len(requests), 8
    meta = rt.prepare_step(requests, [1] * n)
    runner.lora_metadata = meta
    runner.prepare_decode_inputs(requests, n)
    want = runner.run_decode_step(n).clone()
    static = static_lora_meta(runner, b)
    graphs = CudaGraphRunner(
        make_decode_step(runner, static), decode_graph_inputs(runner), [b], device="cpu"
    )
    replay = _replay(graphs, runner, b, static)
    runner.prepare_decode_inputs(requests, b)
    got = replay()
    assert (got[:n] - want).abs().max().item() < 1e-4
    assert static.slot_num_tokens.tolist() == [2, 1, 1, 1]


def test_base_only_graphs_refuse_adapter_steps(decode_ready):
    core, requests = decode_ready
    meta = core.lora_runtime.prepare_step(requests, [1] * len(requests))
    assert not load_static_lora(None, meta, 8)  # base graphs: the step must run eager
    assert load_static_lora(None, None, 8)

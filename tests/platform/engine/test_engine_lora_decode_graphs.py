"""Decode CUDA graphs with LoRA active.

CPU: the graph-static step (the function the capture records) with mixed adapters, base rows and
padding equals the eager LoRA decode, run in a fresh interpreter under TRITON_INTERPRET=1
(engine_lora_graph_cases.py). GPU only: an engine captures its decode graphs with adapters and
replays them with the same tokens and logits as an eager engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.peft_adapters import make_adapter  # noqa: E402
from support.triton_interpreter import run_cases_interpreted  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_graph_static_lora_step_matches_eager_under_interpreter() -> None:
    pytest.importorskip("triton")
    pytest.importorskip("peft")
    out = run_cases_interpreted(Path(__file__).with_name("engine_lora_graph_cases.py"))
    assert "4 passed" in out


def test_adapter_steps_pad_only_to_graphs_captured_with_lora(tmp_path: Path) -> None:
    save_tiny_model(tmp_path, "llama", seed=2, with_tokenizer=False)
    runner = LLM(str(tmp_path), block_size=4, max_num_seqs=8).core.runner
    runner.decode_graphs[4] = lambda: pytest.fail("no graph may run in this test")
    runner.lora_metadata = object()  # a step that carries adapters
    assert runner.decode_batch_size(3) == 3  # base-only graphs: eager, unpadded
    runner.decode_graphs_have_lora = True
    assert runner.decode_batch_size(3) == 4  # graphs captured with LoRA: padded, replayed


@pytest.fixture(scope="module")
def lora_world(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("graph-lora-base")
    hf = save_tiny_model(base, "llama", seed=5, with_tokenizer=False)
    kws = [
        dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        dict(r=16, lora_alpha=32, target_modules="all-linear"),
        dict(r=8, lora_alpha=8, use_rslora=True, target_modules=["o_proj", "down_proj"]),
    ]
    dirs = [str(make_adapter(hf, tmp_path_factory.mktemp(f"a{i}"), 60 + i, **kw))
            for i, kw in enumerate(kws)]  # fmt: skip
    return str(base), dirs


@needs_cuda
def test_lora_graph_replay_matches_eager_tokens(lora_world) -> None:
    pytest.importorskip("triton")
    base, dirs = lora_world
    kw = dict(device="cuda", block_size=16, max_num_seqs=8, max_loras=4, max_lora_rank=16)
    eager = LLM(base, enforce_eager=True, **kw)
    graphed = LLM(base, **kw)
    runner = graphed.core.runner
    assert runner.decode_graphs_have_lora and sorted(runner.decode_graphs) == [1, 2, 4, 8]
    replays = {"lora": 0, "base": 0}
    for b, fn in list(runner.decode_graphs.items()):

        def counted(fn=fn):
            replays["base" if runner.lora_metadata is None else "lora"] += 1
            return fn()

        runner.decode_graphs[b] = counted
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (5, 17, 9, 3, 12)]
    adapters = [dirs[0], None, dirs[1], dirs[0], dirs[2]]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, adapters=adapters)]
    got = [o.outputs[0].token_ids for o in graphed.generate(prompts, params, adapters=adapters)]
    assert got == want
    assert replays["lora"] > 0  # decode steps with adapters replayed, padded to 8
    base_only = [o.outputs[0].token_ids for o in graphed.generate(prompts[:3], params)]
    assert base_only == [o.outputs[0].token_ids for o in eager.generate(prompts[:3], params)]
    assert replays["base"] > 0  # base-only steps replay the same graphs (every slot -1)


@needs_cuda
def test_lora_graph_replay_matches_eager_logits(lora_world) -> None:
    pytest.importorskip("triton")
    base, dirs = lora_world
    llm = LLM(base, device="cuda", block_size=16, max_num_seqs=8, max_loras=4, max_lora_rank=16)
    core, runner = llm.core, llm.core.runner
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    adapters = [dirs[1], None, dirs[0]]
    for i, ref in enumerate(adapters):
        core.add_request(list(range(5 + i, 20 + 2 * i)), params, f"g{i}", ref)
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step()
    requests = [s.request for s in core.scheduler.schedule().scheduled]
    runner.lora_metadata = core.lora_runtime.prepare_step(requests, [1] * len(requests))
    b = runner.decode_batch_size(len(requests))
    assert b == 4  # a step with adapters is padded to the next captured size
    runner.prepare_decode_inputs(requests, b)
    with torch.inference_mode():
        replayed = runner.decode_graphs[b]()[:3].clone()
        runner.prepare_decode_inputs(requests, 3)
        eager = runner.run_decode_step(3)
    torch.testing.assert_close(replayed, eager, atol=1e-3, rtol=0)

"""Decode CUDA graphs in the engine: which sizes are captured, CPU engines run eager (graph
capture recorded as skipped in the cold-start timeline and on /metrics), and, on a GPU only,
replay gives the same logits and tokens as eager decoding."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench import graphs as graphs_bench  # noqa: E402
from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.decode_graphs import (  # noqa: E402
    capture_sizes,
    decode_graph_inputs,
    eager_reason,
    make_decode_step,
)
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPTS = [[5, 6, 7], list(range(3, 30)), [9] * 11]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-graphs")
    save_tiny_model(path, "llama", seed=2, with_tokenizer=False)
    return path


def test_capture_sizes_are_vllm_like_and_capped(tiny: Path) -> None:
    cfg = EngineConfig(str(tiny), max_num_seqs=64)
    assert capture_sizes(cfg) == [64, 56, 48, 40, 32, 24, 16, 8, 4, 2, 1]
    assert capture_sizes(EngineConfig(str(tiny), max_num_seqs=3)) == [3, 2, 1]
    explicit = EngineConfig(str(tiny), max_num_seqs=8, cuda_graph_sizes=[1, 4, 100])
    assert capture_sizes(explicit) == [4, 1]
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        EngineConfig(str(tiny), cuda_graph_sizes=[0, 2])


def test_eager_reasons(tiny: Path) -> None:
    cfg = EngineConfig(str(tiny))
    assert "GPU" in eager_reason(cfg, torch.device("cpu"))
    forced = EngineConfig(str(tiny), enforce_eager=True)
    assert "enforce_eager" in eager_reason(forced, torch.device("cuda"))


def test_cpu_engine_runs_eager_and_records_capture_as_skipped(
    tiny: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="loraplex.loader.timeline"):
        llm = LLM(str(tiny), block_size=4, max_num_seqs=4)
    logged = [r.getMessage() for r in caplog.records if "cold start of" in r.getMessage()]
    assert logged and "graph_capture=skipped" in logged[-1] and "ready=" in logged[-1]
    core = llm.core
    assert core.decode_graphs is None
    assert core.runner.decode_graphs == {}
    assert core.runner.decode_batch_size(3) == 3
    timeline = core.timeline
    assert "cpu" in timeline.skipped["graph_capture"]
    assert "graph_capture" not in timeline.seconds and timeline.seconds["ready"] > 0
    assert "graph_capture=skipped" in timeline.summary()
    text = core.metrics.render().decode()
    assert 'loraplex:cold_start_phase_skipped{model_name="' in text
    assert 'phase="graph_capture"} 1.0' in text
    out = llm.generate(PROMPTS, GREEDY)
    assert all(len(o.outputs[0].token_ids) == 12 for o in out)


def _decode_ready(llm: LLM) -> list:
    """Prefill PROMPTS, then schedule one decode-only step; return its requests."""
    core = llm.core
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(prompt, params, f"r{i}")
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step()
    return [s.request for s in core.scheduler.schedule().scheduled]


def test_captured_step_computes_the_eager_decode(tiny: Path) -> None:
    """The function the GPU captures, run eagerly here on its padded inputs, gives the
    runner's own decode logits (the graph wiring, checked without a GPU)."""
    llm = LLM(str(tiny), block_size=4, max_num_seqs=8)
    runner = llm.core.runner
    requests = _decode_ready(llm)
    b = 4  # one padding row past the 3 live ones
    runner.prepare_decode_inputs(requests, b)
    specs = decode_graph_inputs(runner)
    buffers = [
        runner.decode_input_ids[:b],
        runner.decode_positions[:b],
        runner.decode_slot_mapping[:b],
        runner.decode_seq_lens[:b],
        runner.decode_context_lens[:b],
        runner.decode_block_tables[:b],
    ]
    for spec, buf in zip(specs, buffers, strict=True):
        assert buf.dtype == spec.dtype and tuple(buf.shape[1:]) == spec.row_shape, spec.name
        assert (buf[3:] == spec.pad_value).all(), spec.name  # the runner pads like the graphs
    with torch.inference_mode():
        want = runner.run_decode_step(b)[:3].clone()
        got = make_decode_step(runner)(*buffers)[:3]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_steps_with_lora_metadata_are_not_padded(tiny: Path) -> None:
    runner = LLM(str(tiny), block_size=4, max_num_seqs=8).core.runner
    runner.decode_graphs[4] = lambda: pytest.fail("no graph may run in this test")
    assert runner.decode_batch_size(3) == 4
    runner.lora_metadata = object()  # a step that carries adapters: graphs hold the base only
    assert runner.decode_batch_size(3) == 3


def test_graph_bench_without_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the bench would measure")
    assert graphs_bench.main([]) == 0
    printed = capsys.readouterr().out
    assert "needs a CUDA GPU" in printed and "RESULT" not in printed


@needs_cuda
def test_graph_replay_matches_eager_tokens(tiny: Path) -> None:
    kw = dict(device="cuda", block_size=16, max_num_seqs=8)
    eager = LLM(str(tiny), enforce_eager=True, **kw)
    assert eager.core.runner.decode_graphs == {}
    assert "enforce_eager" in eager.core.timeline.skipped["graph_capture"]
    graphed = LLM(str(tiny), **kw)
    assert sorted(graphed.core.runner.decode_graphs) == [1, 2, 4, 8]
    assert graphed.core.runner.decode_batch_size(3) == 4
    assert "graph_capture" in graphed.core.timeline.seconds
    want = [o.outputs[0].token_ids for o in eager.generate(PROMPTS, GREEDY)]
    got = [o.outputs[0].token_ids for o in graphed.generate(PROMPTS, GREEDY)]
    assert got == want


@needs_cuda
def test_graph_replay_matches_eager_logits(tiny: Path) -> None:
    llm = LLM(str(tiny), device="cuda", block_size=16, max_num_seqs=8)
    runner = llm.core.runner
    requests = _decode_ready(llm)
    b = runner.decode_batch_size(len(requests))
    assert b == 4
    runner.prepare_decode_inputs(requests, b)
    with torch.inference_mode():
        replayed = runner.decode_graphs[b]()[:3].clone()
        eager = runner.run_decode_step(b)[:3]
    torch.testing.assert_close(replayed, eager, atol=1e-4, rtol=0)

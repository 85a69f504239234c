"""GPU only: the decode step captured as CUDA graphs gives the same tokens as eager mode.

Capture itself is `cuda_graphs.py`'s (test_engine_cuda_graph_runner.py); this checks the
model's side (`prepare_decode_inputs` / `run_decode_step` on static buffers, `decode_graphs`
replays).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def capture_decode_graphs(llm: LLM, sizes: list[int]) -> None:
    runner = llm.core.runner
    pool = None
    for b in sorted(sizes, reverse=True):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                runner.run_decode_step(b)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = runner.run_decode_step(b)
        pool = graph.pool()

        def replay(graph: torch.cuda.CUDAGraph = graph, out: torch.Tensor = out) -> torch.Tensor:
            graph.replay()
            return out

        runner.decode_graphs[b] = replay


def test_graph_replay_matches_eager(tmp_path) -> None:
    save_tiny_model(tmp_path, "llama")
    prompts = [[5, 6, 7], list(range(3, 30)), [9] * 11]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    eager = LLM(str(tmp_path), device="cuda", block_size=16, max_num_seqs=8)
    expected = [o.token_ids for o in eager.generate(prompts, params)]
    graphed = LLM(str(tmp_path), device="cuda", block_size=16, max_num_seqs=8)
    capture_decode_graphs(graphed, [1, 2, 4, 8])
    assert graphed.core.runner.decode_batch_size(3) == 4
    assert [o.token_ids for o in graphed.generate(prompts, params)] == expected

"""`loraplex engine --model DIR --ep-size 2` as a real process: it spawns its follower rank,
serves `/generate`, and gives the same greedy tokens as a single-process engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.moe_ep_workers import save_tiny_qwen2_moe
from support.replica_wire import body, generate

from loraplex.platform.engine_spec.config import EngineConfig
from loraplex.platform.local_processes import start_engine_process

pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def _single_process_tokens(model_dir: Path) -> list[list[int]]:
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.sampling_params import SamplingParams

    config = EngineConfig(model=model_dir, block_size=8, num_gpu_blocks=64, max_model_len=64)
    core = EngineCore(config)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    reqs = [core.add_request(p, params) for p in PROMPTS]
    while core.has_unfinished():
        core.step()
    return [list(r.output_token_ids) for r in reqs]


def test_engine_cli_with_ep_size_two_serves_like_one_rank(tmp_path: Path) -> None:
    model_dir = save_tiny_qwen2_moe(tmp_path / "qwen2moe")
    config = EngineConfig(model=model_dir, block_size=8, num_gpu_blocks=64, max_model_len=64,
                          max_loras=0, ep_size=2)  # fmt: skip
    # `loraplex engine --model DIR ... --ep-size 2`: the command line EngineConfig generates.
    base, proc = start_engine_process(
        config, tmp_path / "engine.log", dict(os.environ), timeout=120
    )
    try:
        got = []
        for prompt in PROMPTS:
            req = body(prompt, max_tokens=6, temperature=0, ignore_eos=True)
            got.append(generate(base, req).token_ids)
    finally:
        proc.stop(timeout=60)
    assert got == _single_process_tokens(model_dir)

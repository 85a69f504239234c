"""The expert-parallel engine (`start_ep_engine`, what `--ep-size N` runs): rank 0 serves,
a spawned follower mirrors each forward; greedy generations equal a single-process
`EngineCore`'s, across a rebalance between steps."""

from __future__ import annotations

import pytest
from support.moe_ep_workers import save_tiny_qwen2_moe

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_qwen2_moe(tmp_path_factory.mktemp("qwen2moe_engine"))


def _generate(engine, prompts, steps_before_rebalance=None) -> list[list[int]]:
    from loraplex.platform.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in prompts]
    n = 0
    while engine.has_unfinished():
        engine.step()
        n += 1
        if steps_before_rebalance is not None and n == steps_before_rebalance:
            engine.rebalance()
    return [list(r.output_token_ids) for r in reqs]


def test_ep_engine_generates_like_single_process(model_dir):
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.ep_engine import start_ep_engine
    from loraplex.platform.engine_spec.config import EngineConfig

    config = EngineConfig(
        model=model_dir,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=64,
    )
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]
    want = _generate(EngineCore(config), prompts)
    engine = start_ep_engine(config, 2, num_redundant=2, backend="gloo")
    try:
        got = _generate(engine, prompts, steps_before_rebalance=2)
        assert engine.last_rebalance and all(r.after >= r.before for r in engine.last_rebalance)
        registry = engine.metrics.registry  # balancedness is exported on the engine's /metrics
        for r in engine.last_rebalance:
            labels = {"layer": str(r.layer_idx)}
            assert registry.get_sample_value("loraplex:moe_balancedness", labels) == r.after
    finally:
        engine.close()
    assert got == want

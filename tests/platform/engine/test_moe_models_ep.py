"""Expert-parallel MoE models (gloo, rank processes on one machine) give one rank's logits.

A tiny Qwen2-MoE (gated shared expert, one dense layer) runs mixed prefill/decode steps
through the paged KV cache on 2 and 4 ranks, each rank holding only its experts; midway
an EPLB rebalance adds redundant copies and migrates weights. Every step's logits equal
the single-process model's.
"""

from __future__ import annotations

import pytest
import torch
from support.moe_ep_workers import NUM_EXPERTS, ep_rank, run_model, save_tiny_qwen2_moe

from loraplex.moe.ep_launch import run_ep_group
from loraplex.platform.engine.model_loading import load_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_qwen2_moe(tmp_path_factory.mktemp("qwen2moe"))


@pytest.mark.parametrize("world_size", [2, 4])
def test_ep_model_logits_match_single_rank_across_rebalance(model_dir, world_size):
    want = run_model(load_model(model_dir, dtype="float32"))
    results = run_ep_group(world_size, ep_rank, model_dir, backend="gloo")
    for rank, (logits, held, held_after, _) in enumerate(results):
        assert held == [NUM_EXPERTS // world_size]
        assert held_after == [(NUM_EXPERTS + world_size) // world_size]
        for step, (got, ref) in enumerate(zip(logits, want, strict=True)):
            torch.testing.assert_close(
                got, ref, atol=1e-4, rtol=0, msg=lambda m, s=step, r=rank: f"rank {r} step {s}: {m}"
            )
    placements = [r[3] for r in results]
    assert all(p == placements[0] for p in placements)
    # the hot expert got a second copy in every sparse layer
    assert all(p.replica_counts()[0] >= 2 for p in placements[0])

"""DeepSeek-V2 and V3 under expert parallelism (2 gloo ranks, each loading only its experts):
every step's logits of mixed prefill/decode batches over the latent cache equal the
single-process model's, before and after an EPLB rebalance that migrates experts."""

from __future__ import annotations

import pytest
import torch
from support.moe_ep_workers import run_model

from loraplex.moe.ep_launch import run_ep_group
from loraplex.moe.layer import MoEBlock
from loraplex.moe.rebalancer import ExpertRebalancer
from loraplex.platform.engine.model_loading import load_model


def deepseek_rank(ep, path: str):
    """One rank: its share of the model, the mixed steps with a rebalance after step 1."""
    model = load_model(path, dtype="float32")
    blocks = [m for m in model.modules() if isinstance(m, MoEBlock)]
    held = sorted({len(b.local_experts) for b in blocks})
    logits = run_model(model, ExpertRebalancer(model, num_redundant=ep.world_size))
    return logits, held, sorted({len(b.local_experts) for b in blocks})


@pytest.mark.parametrize("case", ["v2_group_limited_yarn", "v3_yarn_interleaved"])
def test_deepseek_ep2_matches_one_rank(tmp_path, case):
    pytest.importorskip("transformers")
    from test_deepseek_models import save_deepseek

    hf = save_deepseek(tmp_path, case, seed=5)
    with torch.no_grad():  # a hot expert, so the rebalance has something to replicate
        for layer in hf.model.layers[1:]:
            layer.mlp.gate.weight[0] += 0.3
    hf.save_pretrained(str(tmp_path))
    want = run_model(load_model(tmp_path, dtype="float32"))
    results = run_ep_group(2, deepseek_rank, str(tmp_path), backend="gloo")
    for rank, (logits, held, held_after) in enumerate(results):
        assert held == [4], f"rank {rank} should hold 4 of the 8 experts"
        assert held_after == [5], f"rank {rank} should hold one redundant copy after the rebalance"
        for step, (got, ref) in enumerate(zip(logits, want, strict=True)):
            torch.testing.assert_close(
                got, ref, atol=1e-5, rtol=0, msg=lambda m, s=step, r=rank: f"rank {r} step {s}: {m}"
            )

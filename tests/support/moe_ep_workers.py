"""Rank functions for test_moe_models_ep.py, kept free of transformers so each spawned
rank process imports only torch and loraplex (rank start-up dominates these tests)."""

from __future__ import annotations

import torch

from loraplex.moe.layer import MoEBlock
from loraplex.moe.rebalancer import ExpertRebalancer
from loraplex.platform.engine.model_loading import load_model
from support.paged_harness import PagedHarness

REBALANCE_AFTER = 1
NUM_EXPERTS = 8


def save_tiny_qwen2_moe(path) -> str:
    """A tiny random Qwen2-MoE (one dense layer), routing skewed to expert 0, saved to `path`."""
    from loraplex.bench._synthetic.models import hf_config, random_model, save_char_tokenizer

    config = hf_config(
        "qwen2_moe", tiny=False,
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        num_experts=NUM_EXPERTS, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    hf = random_model(config, seed=5)
    with torch.no_grad():  # skew routing towards expert 0 so rebalancing has work to do
        for layer in hf.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight[0] += 0.3
    hf.save_pretrained(str(path))
    save_char_tokenizer(path, 128)
    return str(path)


def mixed_steps() -> list[list[tuple[str, list[int]]]]:
    """Prefill, a split prompt, decodes, and a lone decode (fewer tokens than ranks)."""
    g = torch.Generator().manual_seed(11)

    def toks(n: int) -> list[int]:
        return torch.randint(3, 128, (n,), generator=g).tolist()

    p0, p1, p2 = toks(13), toks(9), toks(6)
    steps = [[("s0", p0[:7]), ("s1", p1)], [("s0", p0[7:]), ("s1", toks(1)), ("s2", p2)]]
    steps += [[(s, toks(1)) for s in ("s0", "s1", "s2")] for _ in range(3)]
    steps += [[("s1", toks(1))]]
    return steps


def run_model(model, rebalancer=None) -> list[torch.Tensor]:
    """Logits of every step of `mixed_steps`; rebalances after step REBALANCE_AFTER."""
    harness = PagedHarness(model, block_size=4)
    out = []
    for i, chunks in enumerate(mixed_steps()):
        out.append(torch.cat(harness.step(chunks)))
        if rebalancer is not None and i == REBALANCE_AFTER:
            rebalancer.rebalance()
    return out


def ep_rank(ep, path: str):
    """One EP rank: load its share of the model, run the steps with a rebalance midway."""
    model = load_model(path, dtype="float32")
    blocks = [m for m in model.modules() if isinstance(m, MoEBlock)]
    held = sorted({len(b.local_experts) for b in blocks})
    rebalancer = ExpertRebalancer(model, num_redundant=ep.world_size)
    logits = run_model(model, rebalancer)
    after = [b.placement for b in blocks]
    return logits, held, sorted({len(b.local_experts) for b in blocks}), after

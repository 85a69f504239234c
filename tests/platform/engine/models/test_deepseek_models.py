"""Tiny random DeepSeek-V2 and V3 (MLA, decoupled and YaRN-scaled rope, shared experts,
group-limited routing, first dense layers): the engine's fp32 logprobs equal transformers'
within 1e-5 in mixed batches with a prompt split over steps (chunked prefill) and a
prefix-cache hit, with the KV cache holding latent rows only."""

from __future__ import annotations

import pytest
import torch
from support.paged_harness import PagedHarness, hf_logits

from loraplex.bench._synthetic.models import random_model
from loraplex.moe.layer import MoEBlock
from loraplex.platform.engine.kv_cache import kv_cache_bytes_per_block
from loraplex.platform.engine.model_loading import load_model

transformers = pytest.importorskip("transformers")

YARN = {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
    "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 0.8,
    "beta_fast": 32, "beta_slow": 1,
}  # fmt: skip
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def deepseek_config(version: int, **fields):
    """A tiny DeepSeek config: 3 layers (the first dense), 8 experts in 4 groups, 2 shared."""
    values = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24, n_shared_experts=2,
        first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=1.5,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    values.update(fields)
    cls = transformers.DeepseekV2Config if version == 2 else transformers.DeepseekV3Config
    return cls(**values)


CASES = {
    "v2_group_limited_yarn": (2, dict(topk_method="group_limited_greedy", rope_parameters=YARN)),
    "v2_lite_greedy": (
        2,
        dict(topk_method="greedy", q_lora_rank=None, rope_parameters=DEFAULT_ROPE),
    ),
    "v3_yarn_interleaved": (3, dict(rope_parameters=YARN)),
    "v3_rotate_half": (3, dict(rope_interleave=False, rope_parameters=DEFAULT_ROPE)),
}


def save_deepseek(path, case: str, seed: int = 3):
    """Save the case's random model (V3's correction bias random too); returns it."""
    version, fields = CASES[case]
    hf = random_model(deepseek_config(version, **fields), seed=seed)
    with torch.no_grad():
        for layer in hf.model.layers:
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(0.3 * torch.randn_like(bias))
    hf.save_pretrained(str(path))
    return hf


def check(h: PagedHarness, hf, seq: str, logits: torch.Tensor) -> None:
    tokens = h.tokens[seq]
    ref = hf_logits(hf, tokens)[len(tokens) - logits.shape[0] :]
    assert ref.std() > 0.3, "reference logits too flat for a meaningful comparison"
    torch.testing.assert_close(
        torch.log_softmax(logits, -1), torch.log_softmax(ref, -1), atol=1e-5, rtol=0
    )


def mixed_scenario(model, hf) -> None:
    """Prefill; a prompt over two steps; a decode; a prefix-cache hit; then decodes."""
    h = PagedHarness(model, block_size=4)
    g = torch.Generator().manual_seed(1)
    p0 = torch.randint(3, 128, (13,), generator=g).tolist()
    p1 = torch.randint(3, 128, (9,), generator=g).tolist()
    p2 = p1[:8] + torch.randint(3, 128, (5,), generator=g).tolist()
    out = h.step([("s0", p0[:7]), ("s1", p1)])
    check(h, hf, "s0", out[0])
    check(h, hf, "s1", out[1])
    h.fork_prefix("s1", "s2", 2)
    out = h.step([("s0", p0[7:]), ("s1", [int(out[1][-1].argmax())]), ("s2", p2[8:])])
    seqs = ("s0", "s1", "s2")
    for seq, lg in zip(seqs, out, strict=True):
        check(h, hf, seq, lg)
    for _ in range(3):
        out = h.step([(s, [int(lg[-1].argmax())]) for s, lg in zip(seqs, out, strict=True)])
        for seq, lg in zip(seqs, out, strict=True):
            check(h, hf, seq, lg)


@pytest.mark.parametrize("case", sorted(CASES))
def test_deepseek_logprobs_match_transformers(tmp_path, case):
    hf = save_deepseek(tmp_path, case)
    model = load_model(tmp_path, dtype="float32")
    assert [isinstance(layer.mlp, MoEBlock) for layer in model.model.layers] == [False, True, True]
    mixed_scenario(model, hf)


def test_deepseek_cache_holds_latent_rows(tmp_path):
    save_deepseek(tmp_path, "v3_yarn_interleaved")
    model = load_model(tmp_path, dtype="float32")
    per_token = kv_cache_bytes_per_block(model, 1, torch.float32)
    assert per_token == 3 * (32 + 8) * 4  # layers x (kv_lora_rank + rope dim) x fp32
    expanded = 3 * 4 * ((16 + 8) + 12) * 4  # layers x heads x (qk_head_dim + v_head_dim)
    assert per_token < expanded

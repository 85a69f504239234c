"""MoEBlock equals transformers' sparse MoE modules on random inputs (fp32, 1e-4).

Covers Mixtral, Qwen2-MoE (sigmoid-gated shared expert), Qwen3-MoE and DeepSeek-V3
(sigmoid, grouped top-k with correction bias, shared experts), each loaded from both
checkpoint layouts: per-expert tensors and fused 3-D tensors.
"""

from __future__ import annotations

import pytest
import torch

from loraplex.moe.layer import MoEBlock
from loraplex.moe.spec import moe_spec_from_config

transformers = pytest.importorskip("transformers")


def _mixtral():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(
        hidden_size=32, intermediate_size=48, num_local_experts=6, num_experts_per_tok=2
    )
    return cfg, MixtralSparseMoeBlock(cfg), "w"


def _qwen2():
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    cfg = Qwen2MoeConfig(
        hidden_size=32,
        moe_intermediate_size=24,
        num_experts=8,
        num_experts_per_tok=3,
        shared_expert_intermediate_size=40,
        norm_topk_prob=False,
    )
    return cfg, Qwen2MoeSparseMoeBlock(cfg), "proj"


def _qwen3():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(
        hidden_size=32,
        moe_intermediate_size=16,
        num_experts=10,
        num_experts_per_tok=4,
        norm_topk_prob=True,
    )
    return cfg, Qwen3MoeSparseMoeBlock(cfg), "proj"


def _deepseek():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = DeepseekV3Config(
        hidden_size=32,
        moe_intermediate_size=16,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        n_shared_experts=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )
    return cfg, DeepseekV3MoE(cfg), "proj"


BUILDERS = {"mixtral": _mixtral, "qwen2_moe": _qwen2, "qwen3_moe": _qwen3, "deepseek_v3": _deepseek}


def _randomize(module: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        for name, b in module.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)


def _per_expert_names(fused: dict[str, torch.Tensor], style: str) -> dict[str, torch.Tensor]:
    """Split transformers' fused 3-D expert tensors back into per-expert checkpoint names."""
    out = {}
    gate_name, up_name, down_name = (
        ("w1", "w3", "w2") if style == "w" else ("gate_proj", "up_proj", "down_proj")
    )
    for name, t in fused.items():
        if name == "experts.gate_up_proj":
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"experts.{e}.{gate_name}.weight"] = t[e, :inter].clone()
                out[f"experts.{e}.{up_name}.weight"] = t[e, inter:].clone()
        elif name == "experts.down_proj":
            for e in range(t.shape[0]):
                out[f"experts.{e}.{down_name}.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


@pytest.mark.parametrize("layout", ["fused", "per_expert"])
@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_moe_block_matches_transformers(arch: str, layout: str) -> None:
    cfg, hf_block, style = BUILDERS[arch]()
    hf_block.eval()
    _randomize(hf_block)
    state = {k: v.detach() for k, v in hf_block.state_dict().items()}
    if layout == "per_expert":
        state = _per_expert_names(state, style)
    block = MoEBlock(moe_spec_from_config(cfg.to_dict()), layer_idx=0)
    for name, tensor in state.items():
        assert block.load_weight(name, tensor), name
    x = torch.randn(2, 7, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_block(x).reshape(-1, cfg.hidden_size)
        got = block(x.reshape(-1, cfg.hidden_size))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_moe_block_rejects_bad_fused_shape() -> None:
    cfg, _, _ = _qwen3()
    block = MoEBlock(moe_spec_from_config(cfg.to_dict()))
    with pytest.raises(ValueError, match="shape"):
        block.load_weight("experts.gate_up_proj", torch.zeros(10, 16, 32))
    assert not block.load_weight("self_attn.q_proj.weight", torch.zeros(1))


def test_moe_spec_rejects_unknown_model_type() -> None:
    with pytest.raises(ValueError, match="no MoE block layout"):
        moe_spec_from_config({"model_type": "llama", "hidden_size": 8})

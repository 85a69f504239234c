"""MoE block shape and routing read from a HuggingFace `config.json` dict.

One `MoESpec` describes a sparse block of Mixtral, Qwen2-MoE, Qwen3-MoE or DeepSeek-V2/V3;
defaults follow the transformers config classes so a sparse config.json still works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraplex.moe.gating import GatingConfig


@dataclass(frozen=True)
class MoESpec:
    """Sizes, routing and shared-expert layout of one sparse MoE block."""

    hidden_size: int
    intermediate_size: int  # per routed expert
    num_experts: int
    gating: GatingConfig
    shared_intermediate_size: int = 0  # 0 = no shared expert
    shared_gated: bool = False  # Qwen2-MoE: shared output scaled by sigmoid(gate(x))
    correction_bias: bool = False  # DeepSeek-V3 e_score_correction_bias
    router_fp32: bool = False  # DeepSeek keeps the router weight and logits in fp32
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        if self.hidden_act != "silu":
            raise ValueError(f"MoE experts support hidden_act 'silu' only, got {self.hidden_act!r}")
        if self.gating.top_k > self.num_experts:
            raise ValueError(f"top_k={self.gating.top_k} > num_experts={self.num_experts}")


def _model_type(config: dict[str, Any]) -> str:
    model_type = config.get("model_type")
    if model_type:
        return str(model_type)
    arch = (config.get("architectures") or [""])[0]
    return {
        "MixtralForCausalLM": "mixtral",
        "Qwen2MoeForCausalLM": "qwen2_moe",
        "Qwen3MoeForCausalLM": "qwen3_moe",
        "DeepseekV2ForCausalLM": "deepseek_v2",
        "DeepseekV3ForCausalLM": "deepseek_v3",
    }.get(arch, "")


def _num_experts(config: dict[str, Any], default: int) -> int:
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if config.get(key) is not None:
            return int(config[key])
    return default


def moe_spec_from_config(config: dict[str, Any]) -> MoESpec:
    """Build the sparse-block spec for a supported MoE architecture's config dict."""
    kind = _model_type(config)
    hidden = int(config["hidden_size"])
    act = str(config.get("hidden_act", "silu"))
    if kind == "mixtral":
        return MoESpec(
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_experts=_num_experts(config, 8),
            gating=GatingConfig(top_k=int(config.get("num_experts_per_tok", 2)), renormalize=True),
            hidden_act=act,
        )
    if kind in ("qwen2_moe", "qwen3_moe"):
        shared = int(config.get("shared_expert_intermediate_size", 0)) if kind == "qwen2_moe" else 0
        return MoESpec(
            hidden_size=hidden,
            intermediate_size=int(config["moe_intermediate_size"]),
            num_experts=_num_experts(config, 60 if kind == "qwen2_moe" else 128),
            gating=GatingConfig(
                top_k=int(config.get("num_experts_per_tok", 4 if kind == "qwen2_moe" else 8)),
                renormalize=bool(config.get("norm_topk_prob", False)),
            ),
            shared_intermediate_size=shared,
            shared_gated=shared > 0,
            hidden_act=act,
        )
    if kind == "deepseek_v2":
        moe_inter = int(config["moe_intermediate_size"])
        method = str(config.get("topk_method") or "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"DeepSeek-V2 topk_method {method!r} is not served")
        grouped = method == "group_limited_greedy"
        return MoESpec(
            hidden_size=hidden,
            intermediate_size=moe_inter,
            num_experts=_num_experts(config, 64),
            gating=GatingConfig(
                top_k=int(config["num_experts_per_tok"]),
                renormalize=False,  # transformers' DeepSeek-V2 router never renormalises
                n_group=int(config["n_group"]) if grouped else 1,
                topk_group=int(config["topk_group"]) if grouped else 1,
                routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
            ),
            shared_intermediate_size=moe_inter * int(config.get("n_shared_experts") or 0),
            router_fp32=True,
            hidden_act=act,
        )
    if kind == "deepseek_v3":
        num = _num_experts(config, 256)
        moe_inter = int(config["moe_intermediate_size"])
        return MoESpec(
            hidden_size=hidden,
            intermediate_size=moe_inter,
            num_experts=num,
            gating=GatingConfig(
                top_k=int(config.get("num_experts_per_tok", 8)),
                scoring="sigmoid",
                renormalize=bool(config.get("norm_topk_prob", True)),
                n_group=int(config.get("n_group", 8)),
                topk_group=int(config.get("topk_group", 4)),
                routed_scaling_factor=float(config.get("routed_scaling_factor", 2.5)),
            ),
            shared_intermediate_size=moe_inter * int(config.get("n_shared_experts", 1)),
            correction_bias=True,
            router_fp32=True,
            hidden_act=act,
        )
    raise ValueError(f"no MoE block layout known for model type {kind!r}")

"""Qwen2-MoE (Qwen1.5-MoE): Qwen2 attention, softmax top-k and a sigmoid-gated shared expert."""

from __future__ import annotations

from loraplex.platform.engine.models.decoder import DecoderConfig
from loraplex.platform.engine.models.moe_decoder import MoEDecoderMixin
from loraplex.platform.engine.models.qwen2 import Qwen2ForCausalLM
from loraplex.platform.engine.models.registry import register_model


def qwen_sparse_layer(config: DecoderConfig, layer_idx: int) -> bool:
    """Qwen-MoE's rule: sparse unless in `mlp_only_layers`, every `decoder_sparse_step`-th."""
    raw = config.raw
    only_dense = set(raw.get("mlp_only_layers") or [])
    step = int(raw.get("decoder_sparse_step", 1) or 1)
    experts = int(raw.get("num_experts", raw.get("num_local_experts", 1)) or 0)
    return layer_idx not in only_dense and experts > 0 and (layer_idx + 1) % step == 0


@register_model("Qwen2MoeForCausalLM")
class Qwen2MoeForCausalLM(MoEDecoderMixin, Qwen2ForCausalLM):
    """Qwen2-MoE; `shared_expert` + `shared_expert_gate` ride along in each sparse block."""

    def is_sparse_layer(self, config: DecoderConfig, layer_idx: int) -> bool:
        return qwen_sparse_layer(config, layer_idx)

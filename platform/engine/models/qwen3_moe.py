"""Qwen3-MoE: Qwen3 attention (per-head q/k norm) with a softmax top-k MoE, no shared expert."""

from __future__ import annotations

from loraplex.platform.engine.models.decoder import DecoderConfig
from loraplex.platform.engine.models.moe_decoder import MoEDecoderMixin
from loraplex.platform.engine.models.qwen2_moe import qwen_sparse_layer
from loraplex.platform.engine.models.qwen3 import Qwen3ForCausalLM
from loraplex.platform.engine.models.registry import register_model


@register_model("Qwen3MoeForCausalLM")
class Qwen3MoeForCausalLM(MoEDecoderMixin, Qwen3ForCausalLM):
    """Qwen3-MoE (e.g. Qwen3-30B-A3B); `norm_topk_prob` comes from the config."""

    def is_sparse_layer(self, config: DecoderConfig, layer_idx: int) -> bool:
        return qwen_sparse_layer(config, layer_idx)

"""DeepSeek-V2 and V3: MLA attention, dense first layers, then shared + routed experts.

V2 routes by softmax (greedy, or group-limited greedy: the best groups by their best expert)
times `routed_scaling_factor`; V3 by sigmoid scores whose correction bias picks the groups and
experts, renormalised and scaled (`moe.spec`). V2 pairs its rotary dims interleaved; V3 does
when `rope_interleave` says so (its default).
"""

from __future__ import annotations

from typing import Any

from loraplex.platform.engine.models.decoder_config import DecoderConfig
from loraplex.platform.engine.models.mla_decoder import MLAForCausalLM
from loraplex.platform.engine.models.moe_decoder import MoEDecoderMixin
from loraplex.platform.engine.models.registry import register_model


class DeepseekForCausalLM(MoEDecoderMixin, MLAForCausalLM):
    """The layers from `first_k_dense_replace` on are sparse (transformers' rule)."""

    def is_sparse_layer(self, config: DecoderConfig, layer_idx: int) -> bool:
        """Dense below `first_k_dense_replace`, sparse from there on."""
        return layer_idx >= int(config.raw.get("first_k_dense_replace") or 0)


@register_model("DeepseekV2ForCausalLM")
class DeepseekV2ForCausalLM(DeepseekForCausalLM):
    """DeepSeek-V2 / V2-Lite (a plain q_proj when `q_lora_rank` is null)."""


@register_model("DeepseekV3ForCausalLM")
class DeepseekV3ForCausalLM(DeepseekForCausalLM):
    """DeepSeek-V3 / R1 layout (its multi-token-prediction layer is not run)."""

    def interleaved_rope(self, config: dict[str, Any]) -> bool:
        """`rope_interleave` (transformers' default: True)."""
        return bool(config.get("rope_interleave", True))

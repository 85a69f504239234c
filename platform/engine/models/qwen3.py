"""Qwen3 dense decoders: per-head RMSNorm on q and k before rope."""

from __future__ import annotations

from loraplex.platform.engine.models.decoder import DecoderConfig, DecoderForCausalLM
from loraplex.platform.engine.models.registry import register_model


@register_model("Qwen3ForCausalLM")
class Qwen3ForCausalLM(DecoderForCausalLM):
    """Qwen3: q_norm/k_norm over head_dim; optional `attention_bias` on q/k/v/o."""

    def configure(self, config: DecoderConfig) -> DecoderConfig:
        if config.raw.get("use_sliding_window"):
            raise NotImplementedError("Qwen3 use_sliding_window=true is not supported")
        bias = bool(config.raw.get("attention_bias", False))
        config.qkv_bias = config.o_bias = bias
        config.qk_norm = True
        return config

"""Qwen2 / Qwen2.5 dense decoders: bias on q/k/v, none on o_proj."""

from __future__ import annotations

from loraplex.platform.engine.models.decoder import DecoderConfig, DecoderForCausalLM
from loraplex.platform.engine.models.registry import register_model


@register_model("Qwen2ForCausalLM")
class Qwen2ForCausalLM(DecoderForCausalLM):
    """Qwen2: q/k/v biases; sliding-window attention is not supported."""

    def configure(self, config: DecoderConfig) -> DecoderConfig:
        if config.raw.get("use_sliding_window"):
            raise NotImplementedError("Qwen2 use_sliding_window=true is not supported")
        config.qkv_bias = True
        config.o_bias = False
        return config

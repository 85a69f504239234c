"""Llama (1/2/3, incl. llama3 rope scaling) and Mistral-style dense decoders."""

from __future__ import annotations

from loraplex.platform.engine.models.decoder import DecoderConfig, DecoderForCausalLM
from loraplex.platform.engine.models.registry import register_model


@register_model("LlamaForCausalLM")
class LlamaForCausalLM(DecoderForCausalLM):
    """Llama: optional `attention_bias` on q/k/v/o and `mlp_bias` on the MLP."""

    def configure(self, config: DecoderConfig) -> DecoderConfig:
        bias = bool(config.raw.get("attention_bias", False))
        config.qkv_bias = config.o_bias = bias
        config.mlp_bias = bool(config.raw.get("mlp_bias", False))
        if int(config.raw.get("pretraining_tp", 1) or 1) != 1:
            raise NotImplementedError("pretraining_tp != 1 is not supported")
        return config

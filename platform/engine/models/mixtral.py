"""Mixtral: Llama-style attention with a softmax top-k (renormalised) MoE in every layer."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from loraplex.platform.engine.models.decoder import DecoderConfig
from loraplex.platform.engine.models.llama import LlamaForCausalLM
from loraplex.platform.engine.models.moe_decoder import MoEDecoderMixin
from loraplex.platform.engine.models.registry import register_model


@register_model("MixtralForCausalLM")
class MixtralForCausalLM(MoEDecoderMixin, LlamaForCausalLM):
    """Mixtral-8x7B-style models; checkpoints name the block `block_sparse_moe` (w1/w3/w2)."""

    def configure(self, config: DecoderConfig) -> DecoderConfig:
        if config.raw.get("sliding_window") is not None:
            raise NotImplementedError("Mixtral sliding_window attention is not supported")
        return super().configure(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Legacy `block_sparse_moe.` names and transformers v5's `mlp.` names both load."""
        renamed = ((name.replace(".block_sparse_moe.", ".mlp."), t) for name, t in weights)
        super().load_weights(renamed)

"""Shared pieces of the MoE decoder models: sparse blocks in place of the dense MLP.

A mixin over the dense skeleton (`DecoderForCausalLM` subclasses): `make_mlp` builds a
`loraplex.moe.MoEBlock` for sparse layers; the model can be built for one
expert-parallel rank (`ep=`, or the process's group inside a spawned EP rank), which then
allocates and loads only its experts. Built under a quantized scheme
(`layers.quant.linear_quantization`), the blocks store their routed experts quantized too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from loraplex.moe.expert_parallel import ExpertParallelGroup, process_ep_group
from loraplex.moe.layer import MoEBlock
from loraplex.moe.spec import MoESpec, moe_spec_from_config
from loraplex.moe.stats import ExpertLoadRecorder
from loraplex.platform.engine.layers.quant import current_linear_scheme
from loraplex.platform.engine.models.causal_lm import CausalLM
from loraplex.platform.engine.models.decoder import DecoderConfig, DenseMLP


class MoEDecoderMixin(CausalLM):
    """Put before a dense decoder class in the bases: `class M(MoEDecoderMixin, Qwen3...)`
    (a Module itself, so the MRO runs it first and then the decoder's `__init__`)."""

    def __init__(
        self,
        config: dict[str, Any],
        dtype: torch.dtype,
        *,
        ep: ExpertParallelGroup | None = None,
    ) -> None:
        # Plain attributes (not modules) may be set before nn.Module.__init__.
        self.ep = ep if ep is not None else process_ep_group()
        self.moe_spec: MoESpec = moe_spec_from_config(config)
        super().__init__(config, dtype)

    def is_sparse_layer(self, config: DecoderConfig, layer_idx: int) -> bool:
        """Whether layer `layer_idx` is a MoE layer (Qwen-MoE may interleave dense ones)."""
        return True

    def make_mlp(self, config: DecoderConfig, layer_idx: int, dtype: torch.dtype) -> nn.Module:
        """MoE block for sparse layers, the dense SwiGLU MLP otherwise."""
        if not self.is_sparse_layer(config, layer_idx):
            return DenseMLP(config, layer_idx, dtype)
        return MoEBlock(
            self.moe_spec, layer_idx=layer_idx, dtype=dtype, ep=self.ep,
            quant=current_linear_scheme(),
        )  # fmt: skip

    def moe_blocks(self) -> list[MoEBlock]:
        """The model's MoE blocks in layer order."""
        return [m for m in self.modules() if isinstance(m, MoEBlock)]

    def attach_load_recorder(self, recorder: ExpertLoadRecorder | None) -> None:
        """Count routed pairs per (layer, expert) into `recorder` from now on (None stops)."""
        for block in self.moe_blocks():
            block.load_recorder = recorder

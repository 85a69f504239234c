"""The deployment's weight quantization choice, as the engine serves it.

Casts (fp32 / bf16 / fp16) set the dtype the model runs in. int8 (W8A16), int4 / int4_sym
(W4A16, groups of 128) and fp8 (W8A8 e4m3) store the Linear layers' weights quantized
(`layers/quant/`); everything else (embeddings, norms, the head, MoE experts) and the
activations stay in the engine's compute dtype (`EngineConfig.dtype`; deployments run
quantized choices in bfloat16). The loader quantizes exactly the model's quantized Linears'
weights as they stream in. Unknown choices are a ValueError.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from loraplex.loader.quant import Quantizer, QuantScheme, resolve_scheme
from loraplex.platform.engine.layers.quant import linear_quantization
from loraplex.platform.engine.models.weight_loading import quantized_weight_names


@dataclass(frozen=True)
class WeightQuantization:
    """A validated choice: its canonical name, scheme and, when set, the model's dtype."""

    choice: str
    cast_to: torch.dtype | None
    scheme: QuantScheme

    @contextmanager
    def building(self) -> Iterator[None]:
        """Build the model inside this block so its Linears store weights as the scheme says."""
        with linear_quantization(self.scheme):
            yield

    def quantizer(self, model: nn.Module | None = None) -> Quantizer | None:
        """The loader's per-tensor quantizer (None when nothing changes); given the built model,
        it quantizes exactly the weights of the model's quantized Linears."""
        if self.choice in ("none", "auto"):
            return None
        if model is None or not self.scheme.quantizes_linears:
            return Quantizer(self.scheme)
        names = quantized_weight_names(model)
        return Quantizer(self.scheme, targets=names.__contains__)


def resolve_weight_quantization(choice: str | None) -> WeightQuantization:
    """Validate a quantization choice for serving (ValueError if unknown)."""
    scheme = resolve_scheme(choice)
    return WeightQuantization(scheme.name, scheme.cast_to, scheme)


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters and buffers hold (a tied tensor counted once)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        key = t.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total

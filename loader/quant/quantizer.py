"""Apply a quantization choice to (name, tensor) pairs as they stream in from storage."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

import torch

from loraplex.loader.quant.schemes import QuantScheme, resolve_scheme
from loraplex.loader.quant.weight_only import (
    quantize_fp8_per_channel,
    quantize_int4_grouped,
    quantize_int8_per_channel,
)

# Floating dtypes a cast may touch: fp8 tensors carry scales elsewhere and are left alone.
_CASTABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Without the model's list: leave embeddings, the head, norms, routers and MoE experts alone.
DEFAULT_SKIP = re.compile(r"(embed|wte|wpe|lm_head|norm|\.gate\.weight$|router|experts)")


class TensorQuantizer(Protocol):
    """What the loader applies to each tensor as it arrives: a `Quantizer`, or the reader of
    a pre-quantized checkpoint (`compressed_tensors`, `awq_gptq`)."""

    def apply(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The tensors to hand on for one checkpoint tensor (none while a module is partial)."""
        ...


class Quantizer:
    """Turns each checkpoint tensor into the tensors the model loads.

    A linear weight the choice quantizes becomes `<p>.weight` (codes) plus `<p>.weight_scale`
    (and `<p>.weight_zero` for asymmetric int4); other floating tensors are cast. `targets`,
    when given, says which `*.weight` names are quantized (the model knows its Linears);
    otherwise every 2-D weight outside `DEFAULT_SKIP` is.
    """

    def __init__(
        self, choice: str | QuantScheme | None, targets: Callable[[str], bool] | None = None
    ) -> None:
        self.scheme = choice if isinstance(choice, QuantScheme) else resolve_scheme(choice)
        self.choice = self.scheme.name
        self.cast_to = self.scheme.cast_to
        self._targets = targets or (lambda name: DEFAULT_SKIP.search(name) is None)

    def targets(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether `name` is a linear weight this choice stores quantized."""
        return (
            self.scheme.quantizes_linears
            and tensor.ndim == 2
            and tensor.dtype in _CASTABLE
            and name.endswith(".weight")
            and self._targets(name)
        )

    targets_int8 = targets  # the name earlier callers used

    def apply(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The tensors to hand on for one checkpoint tensor."""
        if self.targets(name, tensor):
            prefix = name[: -len("weight")]
            kind = self.scheme.kind
            if kind == "int8":
                q, scale = quantize_int8_per_channel(tensor)
                return [(name, q), (prefix + "weight_scale", scale)]
            if kind == "fp8":
                q, scale = quantize_fp8_per_channel(tensor)
                return [(name, q), (prefix + "weight_scale", scale)]
            q, scale, zero = quantize_int4_grouped(
                tensor, self.scheme.group_size, symmetric=self.scheme.symmetric
            )
            out = [(name, q), (prefix + "weight_scale", scale)]
            return out if self.scheme.symmetric else [*out, (prefix + "weight_zero", zero)]
        if self.cast_to is not None and tensor.dtype in _CASTABLE and tensor.dtype != self.cast_to:
            return [(name, tensor.to(self.cast_to))]
        return [(name, tensor)]

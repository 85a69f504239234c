"""The deployment's weight quantization, applied to each tensor as it arrives from storage.

Implemented: plain casts (fp32, bf16, fp16) of floating-point tensors, and int8 weight-only
quantization (symmetric, one scale per output channel) of linear weights, which yields the int8
weight plus a `<prefix>.weight_scale` tensor. fp8 and int4 are recognised but not implemented
and raise NotImplementedError; anything else is refused with ValueError.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

_CASTS: dict[str, torch.dtype | None] = {
    "none": None,
    "auto": None,
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
_INT8 = ("int8", "w8a16", "int8_weight_only")
_NOT_IMPLEMENTED = ("fp8", "fp8_e4m3", "fp8_e5m2", "int4", "w4a16", "awq", "gptq")

# Floating dtypes a cast may touch: fp8 tensors carry scales elsewhere and are left alone.
_CASTABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Linear weights int8 leaves alone: embeddings, the output head, norms and MoE routers.
DEFAULT_INT8_SKIP = re.compile(r"(embed|wte|wpe|lm_head|norm|\.gate\.weight$|router)")


def parse_quantization(choice: str | None) -> str:
    """Canonical form of a quantization choice; ValueError if unknown, NotImplementedError if unbuilt."""
    key = "none" if choice is None else str(choice).strip().lower()
    if key in _CASTS or key in _INT8:
        return "int8" if key in _INT8 else key
    if key in _NOT_IMPLEMENTED:
        raise NotImplementedError(
            f"weight quantization {choice!r} is not implemented in the loader yet; "
            f"implemented: none, fp32, bf16, fp16, int8"
        )
    raise ValueError(
        f"unknown weight quantization {choice!r}; expected one of none, fp32, bf16, fp16, int8"
    )


def quantize_int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: returns (q int8 [out, in], scale float32 [out])."""
    if weight.ndim != 2 or not weight.is_floating_point():
        raise ValueError(f"int8 quantization needs a 2-D floating weight, got {weight.shape}")
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = (amax / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Undo `quantize_int8_per_channel` (up to rounding): q * scale, as `dtype`."""
    return (q.float() * scale.float()[:, None]).to(dtype)


class Quantizer:
    """Applies one quantization choice to (name, tensor) pairs as they stream in."""

    def __init__(self, choice: str | None, skip: Callable[[str], bool] | None = None) -> None:
        self.choice = parse_quantization(choice)
        self.cast_to = _CASTS.get(self.choice)
        self._skip = skip or (lambda name: DEFAULT_INT8_SKIP.search(name) is not None)

    def targets_int8(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether int8 applies: a 2-D floating `*.weight` that is not an embedding/head/norm."""
        return (
            self.choice == "int8"
            and tensor.ndim == 2
            and tensor.dtype in _CASTABLE
            and name.endswith(".weight")
            and not self._skip(name)
        )

    def apply(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The tensors to hand on for one checkpoint tensor (two for an int8 weight)."""
        if self.targets_int8(name, tensor):
            q, scale = quantize_int8_per_channel(tensor)
            return [(name, q), (name[: -len("weight")] + "weight_scale", scale)]
        if self.cast_to is not None and tensor.dtype in _CASTABLE and tensor.dtype != self.cast_to:
            return [(name, tensor.to(self.cast_to))]
        return [(name, tensor)]

"""The deployment's weight quantization choice, as the engine can serve it.

The loader (`loraplex.loader.quantize`) applies a choice to each tensor on the way in. The
engine serves only what its layers can run: fp32 / bf16 / fp16 are casts (the model then runs
in that dtype); int8 weight-only also needs Linear layers that consume the `weight_scale` tensor
the loader emits, which the engine's Linear does not yet, so int8 is refused with a clear
NotImplementedError (as are fp8 and int4); unknown choices are a ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.loader.quantize import Quantizer, parse_quantization

_NO_OP = ("none", "auto")


def linear_consumes_weight_scale() -> bool:
    """Whether the engine's Linear layers can run int8 weights with a per-channel `weight_scale`."""
    from loraplex.platform.engine.layers.linear import Linear

    return bool(getattr(Linear, "consumes_weight_scale", False))


@dataclass(frozen=True)
class WeightQuantization:
    """A validated choice: its canonical name and, for a cast, the dtype the model runs in."""

    choice: str
    cast_to: torch.dtype | None

    def quantizer(self) -> Quantizer | None:
        """The loader's per-tensor quantizer for this choice (None when nothing changes)."""
        return None if self.choice in _NO_OP else Quantizer(self.choice)


def resolve_weight_quantization(choice: str | None) -> WeightQuantization:
    """Validate a quantization choice for serving; ValueError if unknown, NotImplementedError
    if the loader or the engine's layers cannot do it."""
    canonical = parse_quantization(choice)
    if canonical == "int8" and not linear_consumes_weight_scale():
        raise NotImplementedError(
            "int8 weight-only quantization is not served yet: the loader can produce int8 "
            "weights with a per-channel weight_scale, but the engine's Linear layers have no "
            "int8 path that consumes weight_scale; use fp32, bf16 or fp16"
        )
    return WeightQuantization(canonical, Quantizer(canonical).cast_to)

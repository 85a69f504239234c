"""Gated activations on fused gate/up outputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` where `x = cat(gate, up)` along the last dimension."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


SUPPORTED_ACTIVATIONS = ("silu",)


def check_activation(name: str) -> None:
    """Raise a clear error for a gated activation the engine does not implement."""
    if name not in SUPPORTED_ACTIVATIONS:
        raise NotImplementedError(
            f"hidden_act={name!r} is not supported (supported: {list(SUPPORTED_ACTIVATIONS)})"
        )

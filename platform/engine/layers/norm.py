"""RMSNorm computed in fp32 and cast back, the way the HuggingFace reference does it."""

from __future__ import annotations

import torch
from torch import nn

from loraplex.platform.engine.layers.fixed_order_cpu import fixed_order_rmsnorm


class RMSNorm(nn.Module):
    """Root-mean-square layer norm over the last dimension with a learned scale."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        # The deterministic mode's batch-invariant kernel (`batch_invariant.py` sets it).
        self.fixed_order = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise `x` (any leading shape) and scale by the weight."""
        if self.fixed_order:
            return fixed_order_rmsnorm(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(dtype)

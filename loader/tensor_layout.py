"""Layout checks the hand-written kernels share: they index rows by one stride and assume the
last dimension is dense, so a caller's transposed or sliced view must fail loudly, not read
the wrong elements. (In `loader`, the lowest layer, so `adapters`, `moe` and the engine can
all import it.)"""

from __future__ import annotations

import torch


def require_stride1_last(kernel: str, **tensors: torch.Tensor) -> None:
    """Raise ValueError naming the first tensor whose last dimension is not stride 1."""
    for name, t in tensors.items():
        if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(
                f"{kernel} needs {name} with a stride-1 last dimension; got strides "
                f"{tuple(t.stride())} for shape {tuple(t.shape)} (pass .contiguous())"
            )


def require_contiguous(kernel: str, **tensors: torch.Tensor) -> None:
    """Raise ValueError naming the first tensor that is not contiguous."""
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{kernel} needs {name} contiguous (pass .contiguous())")

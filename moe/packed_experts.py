"""Float expert stacks packed once at load for oneDNN's CPU GEMM, one packed matrix per slot.

`torch.mm` on a plain `[N, K]` expert weight leaves the blocked layout to the library on every
call; for the few rows an expert gets at decode (1 to ~64) that costs as much as the
arithmetic, and MKL's fp32 path is slow for 2-8 rows. Reordered once per expert
(`torch.ops.mkldnn._reorder_linear_weight`), the grouped path multiplies each expert's rows by
its packed matrix (`_linear_pointwise`): same products, fp32 accumulation (`loraplex bench moe`
measures it against the gather-and-matmul loop at decode and prefill sizes). The packed
matrices replace the dense stack (no second copy); `dense()` rebuilds it when weights must move
(an EPLB placement change) or be read.
"""

from __future__ import annotations

import torch

PACK_ROWS_HINT = 64
"""The row count the blocked layout is tuned for (any row count works)."""


def can_pack_experts(stack: torch.Tensor) -> bool:
    """Whether a float expert stack [E, N, K] on this CPU can be packed for oneDNN."""
    ops = torch.ops.mkldnn
    if stack.device.type != "cpu" or stack.dim() != 3 or stack.layout != torch.strided:
        return False
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    ):
        return False
    if stack.dtype == torch.bfloat16:
        return bool(ops._is_mkldnn_bf16_supported())
    return stack.dtype == torch.float32


class PackedExperts:
    """An expert stack as oneDNN-packed matrices, one per local slot (see module doc)."""

    def __init__(self, stack: torch.Tensor) -> None:
        if not can_pack_experts(stack):
            raise ValueError(
                f"cannot pack a {stack.dtype} {tuple(stack.shape)} expert stack on "
                f"{stack.device} for oneDNN (fp32, or bf16 on a CPU with native bf16)"
            )
        self.shape = torch.Size(stack.shape)
        self.dtype = stack.dtype
        self.device = stack.device
        self.packed = [
            torch.ops.mkldnn._reorder_linear_weight(stack[e].contiguous(), PACK_ROWS_HINT)
            for e in range(stack.shape[0])
        ]

    def dim(self) -> int:
        """3, like the dense stack."""
        return 3

    @property
    def nbytes(self) -> int:
        """Bytes of the packed matrices (those of the dense stack they replace)."""
        return self.shape.numel() * torch.empty((), dtype=self.dtype).element_size()

    def matmul(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        """x [M, K] @ W_expert^T -> [M, N] in x's dtype."""
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed[expert], None, "none", [None], ""
        )
        return y

    def dense(self) -> torch.Tensor:
        """The plain stack [E, N, K] back (for moving or reading weights)."""
        return torch.stack([p.to_dense() for p in self.packed])

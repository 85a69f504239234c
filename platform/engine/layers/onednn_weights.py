"""bf16 weights packed for oneDNN once at load, so a CPU matmul does not repack them per call.

`F.linear` on a CPU hands oneDNN a plain `[out, in]` bf16 weight, and oneDNN reorders it into
its blocked (AMX / AVX-512 tile) layout on every call: for the small GEMMs of decode, that
reorder costs about as much as the arithmetic. Reordered once (`pack_weight`), the weight is an
opaque oneDNN tensor of the same shape that `packed_linear` multiplies by directly, as
PyTorch's own CPU inductor does for frozen weights. Same products, same fp32 accumulation: the
outputs equal `F.linear`'s.

Measured on a 2-core AVX-512-BF16/AMX machine, one thread, 64 rows (`F.linear` -> packed):
the 256 -> 32,000 LM head 7.2 -> 3.7 ms, 256 -> 1,376 0.21 -> 0.07 ms, 688 -> 256
0.075 -> 0.052 ms; at 1 and 512 rows packed is as fast or faster. Only bf16 is packed: fp16
packed was no faster here, fp32 packed (oneDNN or MKL) gained nothing worth a second code path.
The packed tensor replaces the weight (no second copy); `to_dense()` gives the plain one back.
"""

from __future__ import annotations

import torch

PACK_ROWS_HINT = 64
"""The batch size the layout is tuned for (decode batches); any row count works."""


def onednn_bf16_available() -> bool:
    """Whether this PyTorch build and CPU run oneDNN bf16 GEMMs natively (AVX512_BF16/AMX)."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
        and bool(ops._is_mkldnn_bf16_supported())
    )


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `weight` [out, in] is a plain bf16 CPU matrix this machine can pack."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.layout == torch.strided
        and onednn_bf16_available()
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] reordered into oneDNN's blocked layout (same shape, same values)."""
    if not can_pack(weight):
        raise ValueError(
            f"cannot pack a {weight.dtype} {weight.layout} weight on {weight.device} for oneDNN "
            "(bf16 on a CPU with native bf16 only)"
        )
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
        weight.detach().contiguous(), PACK_ROWS_HINT
    )
    return packed


def is_packed(weight: torch.Tensor) -> bool:
    """Whether `weight` is a oneDNN-packed tensor (multiply it with `packed_linear`)."""
    packed: bool = weight.layout == torch._mkldnn  # type: ignore[attr-defined]  # missing from torch's stubs
    return packed


def dense(weight: torch.Tensor) -> torch.Tensor:
    """`weight` as a plain tensor (a packed one unpacked; others as they are), for readers
    such as checks and exports that compare or copy weights."""
    return weight.to_dense() if is_packed(weight) else weight


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., in] @ W^T (+ bias) -> [..., out], W packed by `pack_weight`."""
    y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")
    return y

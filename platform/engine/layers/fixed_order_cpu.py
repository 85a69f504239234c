"""Batch-invariant projections and RMSNorm on a CPU for the deterministic mode (a C kernel).

oneDNN and MKL pick their kernels, blockings and reduction splits by shape, so a row's result
can change with the number of rows beside it. `fixed_order_cpu.c` reduces every dot product
and every norm in one order fixed by the reduced length alone (16 lane sums with fused
multiply-adds, then a fixed pairwise tree), built without reassociation or contraction, so
a row gives the same bits alone, in a batch of 64, in any position and on any thread. Built on
first use (`loader.native_library`); without a C compiler the deterministic mode is refused.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from loraplex.loader.native_library import NativeLibrary

SOURCE = Path(__file__).with_name("fixed_order_cpu.c")
# After the common flags: no reassociation, no contraction (fmaf is written where wanted).
EXTRA_FLAGS = ("-fno-associative-math", "-ffp-contract=off", "-mprefer-vector-width=512")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
LINEAR_ARGS = [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int]
RMSNORM_ARGS = [_PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, ctypes.c_float, ctypes.c_int]
SILU_MUL_ARGS = [_PTR, _I64, _PTR, _I64, _I64, _I64, ctypes.c_int]
LIBRARY = NativeLibrary(
    SOURCE,
    {
        "fixed_order_linear": (LINEAR_ARGS, ctypes.c_int),
        "fixed_order_rmsnorm": (RMSNORM_ARGS, ctypes.c_int),
        "fixed_order_silu_mul": (SILU_MUL_ARGS, None),
    },
    EXTRA_FLAGS,
)


def fixed_order_available() -> bool:
    """Whether the batch-invariant kernels build here (a C compiler, native kernels on)."""
    return LIBRARY.available


def _rows(x: torch.Tensor, width: int, what: str) -> torch.Tensor:
    if x.device.type != "cpu" or x.dtype not in DTYPE_CODES:
        raise ValueError(f"{what}: fixed-order kernels read fp32/bf16 CPU tensors, got "
                         f"{x.dtype} on {x.device}")  # fmt: skip
    x2 = x.reshape(-1, width)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def fixed_order_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T (+ bias) -> [..., N], each output in a fixed order."""
    kernel = LIBRARY.get("fixed_order_linear")
    n, k = weight.shape
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"fixed-order linear needs x, weight and bias of one dtype, got "
                         f"{x.dtype}, {weight.dtype}")  # fmt: skip
    x2 = _rows(x, k, "fixed_order_linear")
    w = weight.contiguous()
    b = None if bias is None else bias.contiguous()
    y = torch.empty(x2.shape[0], n, dtype=x.dtype)
    if x2.shape[0]:
        rc = kernel(x2.data_ptr(), x2.stride(0), w.data_ptr(), None if b is None else b.data_ptr(),
                    y.data_ptr(), y.stride(0), x2.shape[0], k, n, DTYPE_CODES[x.dtype])  # fmt: skip
        if rc:
            raise MemoryError("fixed-order linear could not allocate its scratch rows")
    return y.reshape(*x.shape[:-1], n)


def fixed_order_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, each row alone, its sum of squares in a fixed order."""
    kernel = LIBRARY.get("fixed_order_rmsnorm")
    h = weight.shape[0]
    if weight.dtype != x.dtype:
        raise ValueError(f"fixed-order RMSNorm needs x and weight of one dtype, got {x.dtype}, "
                         f"{weight.dtype}")  # fmt: skip
    x2 = _rows(x, h, "fixed_order_rmsnorm")
    w = weight.contiguous()
    y = torch.empty(x2.shape[0], h, dtype=x.dtype)
    if x2.shape[0]:
        rc = kernel(x2.data_ptr(), x2.stride(0), w.data_ptr(), y.data_ptr(), y.stride(0),
                    x2.shape[0], h, float(eps), DTYPE_CODES[x.dtype])  # fmt: skip
        if rc:
            raise MemoryError("fixed-order RMSNorm could not allocate its scratch rows")
    return y.reshape(x.shape)


def fixed_order_silu_mul(x: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for x = cat(gate, up) [..., 2I] -> [..., I], every element by the same
    scalar code (torch's vectorised SiLU computes a row's tail differently when a batch splits
    it between threads)."""
    kernel = LIBRARY.get("fixed_order_silu_mul")
    i2 = x.shape[-1]
    if i2 % 2:
        raise ValueError(f"silu_mul needs an even last dimension (gate, up), got {i2}")
    x2 = _rows(x, i2, "fixed_order_silu_mul")
    y = torch.empty(x2.shape[0], i2 // 2, dtype=x.dtype)
    if x2.shape[0]:
        kernel(x2.data_ptr(), x2.stride(0), y.data_ptr(), y.stride(0), x2.shape[0], i2 // 2,
               DTYPE_CODES[x.dtype])  # fmt: skip
    return y.reshape(*x.shape[:-1], i2 // 2)

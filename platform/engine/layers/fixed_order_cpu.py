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
from dataclasses import dataclass
from pathlib import Path

import torch

from loraplex.loader.native_library import NativeLibrary

SOURCE = Path(__file__).with_name("fixed_order_cpu.c")
# After the common flags: no reassociation, no contraction (fmaf is written where wanted).
EXTRA_FLAGS = ("-fno-associative-math", "-ffp-contract=off", "-mprefer-vector-width=512")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_INT = ctypes.c_int
LINEAR_ARGS = [_PTR, _I64, _INT, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT]
RMSNORM_ARGS = [_PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, ctypes.c_float, ctypes.c_int]
SILU_MUL_ARGS = [_PTR, _I64, _PTR, _I64, _I64, _I64, ctypes.c_int]
SIGMOID_SCALE_ARGS = [_PTR, _I64, _PTR, _I64, _PTR, _I64, _I64, _I64, ctypes.c_int]
LIBRARY = NativeLibrary(
    SOURCE,
    {
        "fixed_order_linear": (LINEAR_ARGS, ctypes.c_int),
        "fixed_order_rmsnorm": (RMSNORM_ARGS, ctypes.c_int),
        "fixed_order_silu_mul": (SILU_MUL_ARGS, None),
        "fixed_order_sigmoid_scale": (SIGMOID_SCALE_ARGS, None),
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


# How a weight's rows are stored (the C kernel's `kind`).
WEIGHT_KINDS = {"float": 0, "int8": 1, "int4": 2, "fp8": 3}


@dataclass(frozen=True)
class FixedOrderWeight:
    """A quantized [out, in] weight as the fixed-order kernel reads it: `codes` int8 [out, in],
    int4 two a byte [out, in/2] (even input in the low nibble) or e4m3 [out, in]; `scale` fp32
    [out] (applied to each row's dot) or [out, in/group] (applied to each code, `group` > 0);
    int4's `zf` fp32 [out, in/group]: w = (q - 8) * scale + zf."""

    kind: str
    codes: torch.Tensor
    scale: torch.Tensor
    zf: torch.Tensor | None = None
    group: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("int8", "int4", "fp8"):
            raise ValueError(f"no fixed-order weight kind {self.kind!r}")
        tensors = [self.codes, self.scale] + ([self.zf] if self.zf is not None else [])
        if any(not t.is_contiguous() or t.device.type != "cpu" for t in tensors):
            raise ValueError("fixed-order weights are contiguous CPU tensors")
        if self.scale.dtype != torch.float32 or (self.kind == "int4") != (self.zf is not None):
            raise ValueError(f"{self.kind}: fp32 scales (and int4's zf) are required")

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the weight it stands for."""
        n, k = self.codes.shape
        return n, k * 2 if self.kind == "int4" else k


def fixed_order_linear(
    x: torch.Tensor,
    weight: torch.Tensor | FixedOrderWeight,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T (+ bias) -> [..., N], each output in a fixed order; weight a
    tensor in x's dtype or a quantized `FixedOrderWeight`."""
    kernel = LIBRARY.get("fixed_order_linear")
    n, k = weight.shape
    w_dtype = None if isinstance(weight, FixedOrderWeight) else weight.dtype
    if (w_dtype is not None and w_dtype != x.dtype) or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"fixed-order linear needs x, weight and bias of one dtype, got "
                         f"{x.dtype}, {w_dtype or 'quantized'}, "
                         f"{None if bias is None else bias.dtype}")  # fmt: skip
    x2 = _rows(x, k, "fixed_order_linear")
    scale: int | None
    zf: int | None
    if isinstance(weight, FixedOrderWeight):
        kind, w, group = WEIGHT_KINDS[weight.kind], weight.codes, weight.group
        scale, zf = weight.scale.data_ptr(), None if weight.zf is None else weight.zf.data_ptr()
    else:
        kind, w, group, scale, zf = 0, weight.contiguous(), 0, None, None
    b = None if bias is None else bias.contiguous()
    y = torch.empty(x2.shape[0], n, dtype=x.dtype)
    if x2.shape[0]:
        rc = kernel(x2.data_ptr(), x2.stride(0), kind, w.data_ptr(), scale, zf, group,
                    None if b is None else b.data_ptr(), y.data_ptr(), y.stride(0), x2.shape[0],
                    k, n, DTYPE_CODES[x.dtype])  # fmt: skip
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


def fixed_order_sigmoid_scale(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sigmoid(gate) * x for gate [T, 1] and x [T, H] (a shared expert's gate), the sigmoid by
    the same scalar code for every row (torch's vectorised loop computes a tail apart)."""
    kernel = LIBRARY.get("fixed_order_sigmoid_scale")
    if gate.dtype != x.dtype or gate.shape != (x.shape[0], 1):
        raise ValueError(f"sigmoid_scale needs gate [T, 1] of x's dtype, got {tuple(gate.shape)} "
                         f"{gate.dtype} for x {tuple(x.shape)} {x.dtype}")  # fmt: skip
    x2, g = _rows(x, x.shape[-1], "fixed_order_sigmoid_scale"), _rows(gate, 1, "sigmoid gate")
    y = torch.empty_like(x2)
    if x2.shape[0]:
        kernel(g.data_ptr(), g.stride(0), x2.data_ptr(), x2.stride(0), y.data_ptr(), y.stride(0),
               x2.shape[0], x2.shape[1], DTYPE_CODES[x.dtype])  # fmt: skip
    return y

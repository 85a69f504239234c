"""Greedy token choice on a CPU straight from bf16 or fp32 logits (a small C kernel).

`sampler.greedy_argmax` needs fp32 logits (bf16 `amax` is slower than a copy to fp32 and an fp32
`amax`), so a bf16 model paid a [rows, vocab] fp32 copy every step before its argmax.
`greedy_cpu.c` reads each row once in its own dtype (chunk maxima compared as integers, then the
index inside the winning chunk), and returns what `torch.argmax` returns: the first maximum, or
the first NaN. Built on first use (`loader.native_library`); where it cannot be, the sampler
keeps `greedy_argmax` on fp32 logits.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from loraplex.loader.native_library import NativeLibrary

SOURCE = Path(__file__).with_name("greedy_cpu.c")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
# greedy_cpu.c's argmax_rows(logits, dtype, rows, cols, row_stride, out)
LIBRARY = NativeLibrary(
    SOURCE, {"argmax_rows": ([_PTR, ctypes.c_int, _I64, _I64, _I64, _PTR], None)}
)


def native_argmax_available(logits: torch.Tensor) -> bool:
    """Whether `native_argmax` reads these logits (2-D, CPU, fp32/bf16, stride-1 rows)."""
    return (
        logits.device.type == "cpu"
        and logits.dim() == 2
        and logits.dtype in DTYPE_CODES
        and logits.stride(-1) == 1
        and LIBRARY.available
    )


def native_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax [S, V] -> [S] int64, as `torch.argmax(logits, -1)`."""
    kernel = LIBRARY.get("argmax_rows")
    if not native_argmax_available(logits):
        raise ValueError(
            f"native argmax reads 2-D fp32/bf16 CPU logits with stride-1 rows, got "
            f"{logits.dtype} {tuple(logits.shape)} strides {logits.stride()} on {logits.device}"
        )
    rows, cols = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    if rows and cols:
        kernel(logits.data_ptr(), DTYPE_CODES[logits.dtype], rows, cols, logits.stride(0),
               out.data_ptr())  # fmt: skip
    return out

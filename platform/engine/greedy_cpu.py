"""Greedy token choice on a CPU straight from bf16 or fp32 logits (a small C kernel).

`sampler.greedy_argmax` needs fp32 logits (bf16 `amax` is slower than a copy to fp32 and an fp32
`amax`), so a bf16 model paid a [rows, vocab] fp32 copy every step before its argmax.
`greedy_cpu.c` reads each row once in its own dtype (chunk maxima compared as integers, then the
index inside the winning chunk), and returns what `torch.argmax` returns: the first maximum, or
the first NaN. Built on first use (`loader.native_library`); elsewhere `argmax_rows` falls back
to `greedy_argmax` on fp32 logits.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from loraplex.loader.native_library import NativeBuildError, load_library

SOURCE = Path(__file__).with_name("greedy_cpu.c")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

_kernel: ctypes._CFuncPtr | None = None
_build_error: str | None = None


def _load() -> ctypes._CFuncPtr | None:
    global _kernel, _build_error
    if _kernel is None and _build_error is None:
        try:
            fn = load_library(SOURCE).argmax_rows
        except NativeBuildError as exc:
            _build_error = str(exc)
            return None
        i64 = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, i64, i64, i64, ctypes.c_void_p]
        fn.restype = None
        _kernel = fn
    return _kernel


def native_argmax_available(logits: torch.Tensor) -> bool:
    """Whether `native_argmax` reads these logits (2-D, CPU, fp32/bf16, stride-1 rows)."""
    return (
        logits.device.type == "cpu"
        and logits.dim() == 2
        and logits.dtype in DTYPE_CODES
        and logits.stride(-1) == 1
        and _load() is not None
    )


def native_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax [S, V] -> [S] int64, as `torch.argmax(logits, -1)`."""
    kernel = _load()
    if kernel is None:
        raise NativeBuildError(f"the native argmax is unavailable: {_build_error}")
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

"""The native CPU LoRA path: each adapter token against its adapter's pool rows, in one C call.

`lora_packed` turns a step into two batched GEMMs per Linear over chunk weights it gathers
(and caches) per adapter layout: with 32 distinct adapters in a decode batch that is a
19 MB fp32 copy to build and read, and a dozen torch ops per Linear that each pay dispatch and,
with two threads, an OpenMP barrier. `lora_cpu.c` instead walks the step's adapter tokens in
adapter order and, per token, shrinks by its adapter's A rows and expands by its B rows where
they lie in the device pool (bf16 or fp32), accumulating in fp32 and rounding into `y` once,
like Punica's BGMV on a GPU. Work is tokens x rank x (in + out), whatever the number of
adapters; nothing is copied per step. The tokens are split over torch's OpenMP threads (the
library shares torch's libgomp, so no second pool competes for the cores).

It is built for this CPU on first use (`loader.native_library`); where it cannot be, or for
dtypes it does not read, `native_lora_available` is False and the packed path runs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.loader.native_library import NativeLibrary
from loraplex.loader.tensor_layout import require_contiguous, require_stride1_last

SOURCE = Path(__file__).with_name("lora_cpu.c")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
MAX_RANK = 512  # lora_cpu.c's scratch for one slice's rank values

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
# fmt: off
LORA_DELTA_ARGS = [  # lora_cpu.c's lora_delta, in order
    _PTR, _I64, _PTR, _I64, _INT,  # x, x_stride, y, y_stride, act_dtype
    _PTR, _PTR, _INT,  # a_buf, b_buf, w_dtype
    _PTR, _PTR, _PTR,  # sorted_tokens, token_slot, slot_row_start
    _PTR, _PTR, _I64,  # ranks, scales, max_loras
    _PTR, _PTR, _I64, _I64, _I64,  # slice_offsets, slice_sizes, num_slices, d_in, d_out
    _I64,  # total: adapter tokens, the first positions of sorted_tokens
]
# fmt: on
# 512-bit vectors where the CPU has them: one step's LoRA 1.1 -> 0.9 ms (4 adapters) and
# 0.94 -> 0.64 ms (32) on the AVX-512 machine; no effect on AVX2 ones.
EXTRA_FLAGS = ("-mprefer-vector-width=512",)
LIBRARY = NativeLibrary(SOURCE, {"lora_delta": (LORA_DELTA_ARGS, _INT)}, EXTRA_FLAGS)


def native_lora_status() -> str:
    """One line for reports: whether the native LoRA kernel is in use, or why not."""
    if LIBRARY.available:
        return "native CPU kernel (per-token, pool rows in place)"
    return f"packed torch GEMMs ({LIBRARY.error})"


def native_lora_available(x: torch.Tensor, a_buf: torch.Tensor, max_rank: int) -> bool:
    """Whether `lora_delta_native` serves these activations and pool weights."""
    return (
        x.device.type == "cpu"
        and a_buf.device.type == "cpu"
        and x.dtype in DTYPE_CODES
        and a_buf.dtype in DTYPE_CODES
        and max_rank <= MAX_RANK
        and LIBRARY.available
    )


def lora_delta_native(
    x: torch.Tensor,
    y: torch.Tensor,
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    meta: LoraBatchMeta,
    lid: int,
    slice_bounds: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Add every adapter token's delta for Linear `lid` into `y` [T, out] in place.

    `a_buf` is the pool's `[rows, S, in]` A buffer and `b_buf` its `[rows, out]` transposed-B
    buffer; `slice_bounds` the Linear's int32 slice offsets and sizes (`[S]` each, contiguous;
    `LoraHooks.slice_tensors`).
    """
    kernel = LIBRARY.get("lora_delta")
    act, wt = DTYPE_CODES.get(x.dtype), DTYPE_CODES.get(a_buf.dtype)
    if act is None or y.dtype != x.dtype or wt is None or b_buf.dtype != a_buf.dtype:
        raise ValueError(f"native LoRA needs fp32/bf16 x and y alike and fp32/bf16 A and B alike, "
                         f"got {x.dtype}, {y.dtype}, {a_buf.dtype}, {b_buf.dtype}")  # fmt: skip
    require_stride1_last("lora_delta_native", x=x, y=y)
    require_contiguous("lora_delta_native", a_buf=a_buf, b_buf=b_buf)
    offsets, sizes = slice_bounds
    if offsets.dtype != torch.int32 or sizes.dtype != torch.int32:
        raise ValueError("slice offsets and sizes must be int32 tensors")
    num_slices, d_in, d_out = a_buf.shape[1], a_buf.shape[2], b_buf.shape[1]
    if x.shape[-1] != d_in or y.shape[-1] != d_out or offsets.numel() != num_slices:
        raise ValueError(f"x {tuple(x.shape)} / y {tuple(y.shape)} do not fit the pool's "
                         f"{num_slices} slices of {d_in} -> {d_out}")  # fmt: skip
    step = meta.native_step
    if step is None:  # once per step, shared by every Linear
        step = meta.native_step = _step_args(meta)
    total, tokens, token_slot, row_start, ranks, scales, max_loras, per_linear = step
    if total == 0:
        return
    args = (
        x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), act, a_buf.data_ptr(),
        b_buf.data_ptr(), wt, tokens, token_slot, row_start, ranks + lid * per_linear * 4,
        scales + lid * per_linear * 4, max_loras, offsets.data_ptr(), sizes.data_ptr(),
        num_slices, d_in, d_out,
    )  # fmt: skip
    rc = kernel(*args, total)
    if rc == -1:
        raise MemoryError("native LoRA could not allocate its scratch rows")
    if rc == -2:
        raise ValueError(f"an adapter rank exceeds the native kernel's {MAX_RANK}")


def _step_args(meta: LoraBatchMeta) -> tuple[int, ...]:
    """The step's share of the kernel's arguments: adapter tokens, then pointers to the
    metadata (ranks and scales `[num_linears, max_slices, max_loras]` int32 / fp32)."""
    for name, t in (("ranks", meta.ranks), ("scales", meta.scales)):
        if not t.is_contiguous() or t.element_size() != 4:
            raise ValueError(f"LoRA metadata {name} must be contiguous 4-byte values")
    return (
        sum(g.num_tokens for g in meta.groups), meta.sorted_token_ids.data_ptr(),
        meta.token_slot.data_ptr(), meta.slot_row_start.data_ptr(), meta.ranks.data_ptr(),
        meta.scales.data_ptr(), meta.max_loras, meta.ranks.stride(0),
    )  # fmt: skip

"""The native CPU LoRA path: each adapter's tokens against its own pool rows, in one C call.

`lora_packed` turns a step into two batched GEMMs per Linear over chunk weights it gathers
(and caches) per adapter layout: with 32 distinct adapters in a decode batch that is a
19 MB fp32 copy to build and read, and a dozen torch ops per Linear that each pay dispatch and,
with two threads, an OpenMP barrier. `lora_cpu.c` instead takes the step's adapter tokens in
blocks of up to eight tokens of one adapter and shrinks by that adapter's A rows and expands by
its B rows where they lie in the device pool (bf16 or fp32, each chunk converted once per
block), accumulating in fp32 and rounding into `y` once, like Punica's SGMV on a GPU. Work is
tokens x rank x (in + out), whatever the number of adapters; nothing is copied per step. The
blocks are spread over torch's OpenMP threads (the library shares torch's libgomp, so no second
pool competes for the cores). Per call Python checks x and y and passes two structs: the
Linear's (built once, `NativeLoraLinear`) and the step's (built once per step).

It is built for this CPU on first use (`loader.native_library`); where it cannot be, or for
dtypes it does not read, `native_lora_available` is False and the packed path runs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import cast

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.kernels.lora_backend import SliceBounds
from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.loader.native_library import NativeLibrary
from loraplex.loader.tensor_layout import require_contiguous, require_stride1_last

SOURCE = Path(__file__).with_name("lora_cpu.c")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
MAX_RANK = 512  # lora_cpu.c's scratch for one slice's rank values


class LoraLinearArgs(ctypes.Structure):
    """lora_cpu.c's `struct lora_linear`: one Linear's pool buffers and slice table."""

    _fields_ = [
        ("a_buf", ctypes.c_void_p), ("b_buf", ctypes.c_void_p), ("w_dtype", ctypes.c_int64),
        ("slice_offsets", ctypes.c_void_p), ("slice_sizes", ctypes.c_void_p),
        ("num_slices", ctypes.c_int64), ("d_in", ctypes.c_int64), ("d_out", ctypes.c_int64),
    ]  # fmt: skip


class LoraStepArgs(ctypes.Structure):
    """lora_cpu.c's `struct lora_step`: one step's metadata, shared by every Linear."""

    _fields_ = [
        ("sorted_tokens", ctypes.c_void_p), ("slot_start", ctypes.c_void_p),
        ("slot_num_tokens", ctypes.c_void_p), ("slot_row_start", ctypes.c_void_p),
        ("ranks", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("max_loras", ctypes.c_int64),
        ("linear_stride", ctypes.c_int64), ("num_active", ctypes.c_int64),
        ("max_rank", ctypes.c_int64),
    ]  # fmt: skip


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
LORA_DELTA_ARGS = [  # lora_cpu.c's lora_delta: x, x_stride, y, y_stride, act_dtype, lin, step, lid
    _PTR, _I64, _PTR, _I64, _I64, ctypes.POINTER(LoraLinearArgs), ctypes.POINTER(LoraStepArgs),
    _I64,
]  # fmt: skip
# 512-bit vectors where the CPU has them: 10-20% off a layer's four LoRA Linears on the
# AVX-512 machine (64 tokens, 4 or 32 adapters, two threads); no effect on AVX2 ones.
EXTRA_FLAGS = ("-mprefer-vector-width=512",)
LIBRARY = NativeLibrary(SOURCE, {"lora_delta": (LORA_DELTA_ARGS, ctypes.c_int)}, EXTRA_FLAGS)


def native_lora_status() -> str:
    """One line for reports: whether the native LoRA kernel is in use, or why not."""
    if LIBRARY.available:
        return "native CPU kernel (adapter token blocks, pool rows in place)"
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


class NativeLoraLinear:
    """One Linear's side of the native kernel: its pool buffers and int32 slice offsets and
    sizes, checked once and kept as the C struct, so a call checks only x and y (the hooks
    keep one per Linear while the pool's buffers stay where they are)."""

    def __init__(
        self,
        a_buf: torch.Tensor,
        b_buf: torch.Tensor,
        slice_bounds: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        wt = DTYPE_CODES.get(a_buf.dtype)
        if wt is None or b_buf.dtype != a_buf.dtype:
            raise ValueError(f"native LoRA needs fp32/bf16 A and B alike, "
                             f"got {a_buf.dtype}, {b_buf.dtype}")  # fmt: skip
        require_contiguous("lora_delta_native", a_buf=a_buf, b_buf=b_buf)
        offsets, sizes = slice_bounds
        if offsets.dtype != torch.int32 or sizes.dtype != torch.int32:
            raise ValueError("slice offsets and sizes must be int32 tensors")
        require_contiguous("lora_delta_native", slice_offsets=offsets, slice_sizes=sizes)
        num_slices, self.d_in, self.d_out = a_buf.shape[1], a_buf.shape[2], b_buf.shape[1]
        if offsets.numel() != num_slices or sizes.numel() != num_slices:
            raise ValueError(f"{offsets.numel()} slice bounds for a pool of {num_slices} slices")
        self._keep = (a_buf, b_buf, offsets, sizes)  # the struct points into these
        self.args = LoraLinearArgs(
            a_buf.data_ptr(), b_buf.data_ptr(), wt, offsets.data_ptr(), sizes.data_ptr(),
            num_slices, self.d_in, self.d_out,
        )  # fmt: skip
        self._ref = ctypes.byref(self.args)
        self._kernel = LIBRARY.get("lora_delta")  # raises here where the library cannot build

    def serves(self, a_buf: torch.Tensor, b_buf: torch.Tensor) -> bool:
        """Whether these are still the buffers this Linear's struct points at."""
        return bool(a_buf.data_ptr() == self.args.a_buf and b_buf.data_ptr() == self.args.b_buf)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, meta: LoraBatchMeta, lid: int) -> None:
        """Add every adapter token's delta for Linear `lid` into `y` [T, out] in place."""
        act = DTYPE_CODES.get(x.dtype)
        if act is None or y.dtype != x.dtype:
            raise ValueError(f"native LoRA needs fp32/bf16 x and y alike, got {x.dtype}, {y.dtype}")
        if x.stride(-1) != 1 or y.stride(-1) != 1:
            require_stride1_last("lora_delta_native", x=x, y=y)
        if (
            x.dim() != 2
            or y.dim() != 2
            or x.shape[1] != self.d_in
            or y.shape[1] != self.d_out
            or min(x.shape[0], y.shape[0]) < meta.num_tokens
        ):
            raise ValueError(f"x {tuple(x.shape)} / y {tuple(y.shape)} do not fit the pool's "
                             f"{self.d_in} -> {self.d_out} over {meta.num_tokens} tokens")  # fmt: skip
        step = cast("LoraStepArgs | None", meta.native_step)  # only this module sets it
        if step is None:  # once per step, shared by every Linear
            step = meta.native_step = _step_args(meta)
        if step.num_active == 0:
            return
        rc = self._kernel(x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), act, self._ref,
                    ctypes.byref(step), lid)  # fmt: skip
        if rc == -1:
            raise MemoryError("native LoRA could not allocate its scratch rows")
        if rc == -2:
            raise ValueError(f"an adapter rank exceeds the native kernel's {MAX_RANK}")


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
    `LoraHooks.slice_tensors`). The hooks keep the `NativeLoraLinear` instead of rebuilding it.
    """
    NativeLoraLinear(a_buf, b_buf, slice_bounds)(x, y, meta, lid)


class NativeLora:
    """The native CPU kernel as a `LoraBackend`: one `NativeLoraLinear` per Linear, built on
    first use and again when the pool's buffers move."""

    name = "native_cpu"

    def __init__(self, bounds: SliceBounds) -> None:
        self.bounds = bounds
        self._linears: dict[int, NativeLoraLinear] = {}

    def linear(self, lid: int, pool: DevicePool) -> NativeLoraLinear:
        """Linear `lid`'s kernel arguments over the pool's current buffers."""
        native = self._linears.get(lid)
        a, b = pool.a[lid], pool.b[lid]
        if native is None or not native.serves(a, b):
            native = self._linears[lid] = NativeLoraLinear(a, b, self.bounds.get(lid))
        return native

    def delta(
        self,
        lid: int,
        x: torch.Tensor,
        y: torch.Tensor,
        meta: LoraBatchMeta,
        pool: DevicePool,
        spec: LoraLinearSpec,
    ) -> None:
        """Add Linear `lid`'s adapter deltas into `y` in place."""
        self.linear(lid, pool)(x, y, meta, lid)


def native_lora_serves(device: torch.device, dtype: torch.dtype, max_rank: int) -> bool:
    """Whether the native kernel serves a model on `device` in `dtype` (CPU, fp32 or bf16,
    ranks up to MAX_RANK, library built): the build-time form of `native_lora_available`."""
    return (
        device.type == "cpu" and dtype in DTYPE_CODES and max_rank <= MAX_RANK and LIBRARY.available
    )


def _step_args(meta: LoraBatchMeta) -> LoraStepArgs:
    """The step's metadata as the kernel's struct (the tensors stay alive in `meta`)."""
    names = ("sorted_token_ids", "slot_start", "slot_num_tokens", "slot_row_start", "ranks",
             "scales")  # fmt: skip
    for name in names:
        t = getattr(meta, name)
        if not t.is_contiguous() or t.element_size() != 4 or t.device.type != "cpu":
            raise ValueError(f"LoRA metadata {name} must be contiguous 4-byte values on the CPU")
    return LoraStepArgs(
        *(getattr(meta, name).data_ptr() for name in names), meta.max_loras,
        meta.ranks.stride(0), meta.num_active, meta.max_rank,
    )  # fmt: skip

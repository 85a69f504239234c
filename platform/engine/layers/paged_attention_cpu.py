"""Paged decode attention on a CPU that reads the KV blocks in place (a small C kernel).

The torch path (`paged_attention_torch.decode_attention_torch`) gathers every decoding
sequence's K and V blocks into one padded copy per layer and step, then runs SDPA over it: the
copy moves as many bytes as the attention reads. `paged_attention_cpu.c` walks each sequence's
block table instead, one (sequence, KV head) at a time, scoring all the query heads of the group
against each K row it reads, a softmax in fp32, then the V rows. It is built for this CPU on
first use (`loader.native_library`); where it cannot be built, or for caches it does not read
(fp8, fp16), `native_decode_available` says False and the engine keeps the torch path.

The (sequence, KV head) items are split over torch's OpenMP threads: the library shares the
libgomp torch has loaded, so no second thread pool competes for the cores.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from loraplex.loader.native_library import NativeLibrary
from loraplex.loader.tensor_layout import require_contiguous
from loraplex.platform.engine.layers.paged_attention_torch import NO_SCALES, KVScales

SOURCE = Path(__file__).with_name("paged_attention_cpu.c")
# glibc's vector expf (libmvec) for the softmax loop: it is declared only under fast-math.
EXTRA_FLAGS = ("-ffast-math", "-fopenmp-simd")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
# fmt: off
DECODE_ARGS = [  # paged_attention_cpu.c's paged_decode_attention, in order
    _PTR, _PTR, _PTR, _PTR,  # q, out, k_cache, v_cache
    _PTR, _I64, _PTR,  # block_tables, bt_stride, seq_lens
    _I64, _I64, _I64, _I64, _I64,  # num_heads, num_kv_heads, head_dim, block_size, max_seq_len
    ctypes.c_float, ctypes.c_int, _I64,  # scale, dtype, num_seqs
]
WRITE_KV_ARGS = [  # write_kv: k, v, k_stride, v_stride, k_cache, v_cache, slots, tokens, row, elem
    _PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64,
]
# fmt: on
LIBRARY = NativeLibrary(
    SOURCE,
    {"paged_decode_attention": (DECODE_ARGS, ctypes.c_int), "write_kv": (WRITE_KV_ARGS, None)},
    EXTRA_FLAGS,
)


def native_decode_status() -> str:
    """One line for reports: whether the in-place kernel is in use, or why not."""
    if LIBRARY.available:
        return "native CPU kernel (KV blocks read in place)"
    return f"torch gather + SDPA ({LIBRARY.error})"


def native_decode_available(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether `native_decode_attention` serves this query and cache (CPU, fp32 or bf16)."""
    return (
        q.device.type == "cpu"
        and kv_cache.device.type == "cpu"
        and q.dtype in DTYPE_CODES
        and kv_cache.dtype == q.dtype
        and LIBRARY.available
    )


def native_write_kv(
    kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store k, v [T, Hkv, D] at their slots of kv_cache [2, N, bs, Hkv, D] (slot -1 skipped):
    `write_kv_torch` for a float cache of k's dtype, without its mask and index copies."""
    write = LIBRARY.get("write_kv")
    _, _, _, hkv, d = kv_cache.shape
    require_contiguous("native_write_kv", kv_cache=kv_cache)
    for name, x in (("k", k), ("v", v)):
        if x.dtype != kv_cache.dtype or tuple(x.shape[1:]) != (hkv, d):
            raise ValueError(f"{name} {x.dtype} {tuple(x.shape)} does not fit the cache's rows")
        if x.stride(2) != 1 or x.stride(1) != d:
            raise ValueError(f"{name} rows must be contiguous [Hkv, D] (strides {x.stride()})")
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    slots = slots.contiguous()
    n = k.shape[0]
    if slots.shape[0] < n or v.shape[0] != n:
        raise ValueError("k, v and slot_mapping need a row per token")
    base = kv_cache.data_ptr()
    write(
        k.data_ptr(), v.data_ptr(), k.stride(0), v.stride(0), base,
        base + kv_cache[0].numel() * kv_cache.element_size(), slots.data_ptr(), n, hkv * d,
        kv_cache.element_size(),
    )  # fmt: skip


def native_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    scales: KVScales = NO_SCALES,
) -> torch.Tensor:
    """One query token per sequence: q [S, Hq, D] -> out [S, Hq, D] (the torch path's
    signature; a float cache has no scales to apply, so `scales` is not read)."""
    kernel = LIBRARY.get("paged_decode_attention")
    if q.dtype not in DTYPE_CODES or kv_cache.dtype != q.dtype:
        raise ValueError(f"native decode attention needs fp32 or bf16 q and cache alike, got "
                         f"{q.dtype} and {kv_cache.dtype}")  # fmt: skip
    s, hq, d = q.shape
    _, _, bs, hkv, dk = kv_cache.shape
    if dk != d or hq % hkv:
        raise ValueError(f"q heads {hq}x{d} do not fit the cache's {hkv}x{dk}")
    q = q.contiguous()
    tables = block_tables if block_tables.dtype == torch.int32 else block_tables.int()
    lens = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.int()
    tables, lens = tables.contiguous(), lens.contiguous()
    require_contiguous("native_decode_attention", kv_cache=kv_cache)
    if tables.shape[0] < s or lens.shape[0] < s:
        raise ValueError("block_tables and seq_lens need a row per sequence")
    max_len = min(int(max_seq_len), tables.shape[1] * bs)
    out = torch.empty_like(q)
    plane = kv_cache[0].numel() * kv_cache.element_size()
    base = kv_cache.data_ptr()
    args = (
        q.data_ptr(), out.data_ptr(), base, base + plane, tables.data_ptr(), tables.stride(0),
        lens.data_ptr(), hq, hkv, d, bs, max_len, float(scale), DTYPE_CODES[q.dtype],
    )  # fmt: skip
    if kernel(*args, s):
        raise MemoryError("native decode attention could not allocate its scratch rows")
    return out

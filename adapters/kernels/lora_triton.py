"""Punica/SGMV-style segmented LoRA shrink and expand in Triton (the GPU path).

Both kernels launch a static 3-D grid `(token tiles x column tiles, slices, max_loras)`:
the grid depends only on the (padded) token count, `max_lora_rank`, the Linear's shape and
`max_loras`, never on which adapters are active, so a decode step stays CUDA-graph
capturable. A program looks up its step slot in `active_slots` (-1: exits), takes the slot's
run of `sorted_token_ids` (tokens grouped by adapter) and the adapter's first pool row, and
exits early when its tile lies past the slot's token count or the module's rank.

shrink: `h[s, t, :r] = x[t] @ A[row0 : row0 + r, s]^T` (fp32 accumulator buffer)
expand: `y[t, off_s : off_s + size_s] += scale[s, slot] * h[s, t, :r] @ B[row0 : row0 + r, cols]`

Tested on CPU under `TRITON_INTERPRET=1` against the torch path; on CPU the engine uses the
torch path (`lora_torch`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.kernels.lora_backend import SliceBounds
from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.adapters.static_meta import StaticLoraView
from loraplex.loader.tensor_layout import require_stride1_last

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is a Linux dependency
    HAS_TRITON = False

BLOCK_M = 16
BLOCK_N = 16
BLOCK_K = 32


def triton_lora_available(t: torch.Tensor) -> bool:
    """True when these kernels can run natively on t's device (CUDA and triton installed)."""
    return HAS_TRITON and t.is_cuda


if HAS_TRITON:

    @triton.jit
    def _shrink_kernel(
        x_ptr,
        a_ptr,
        h_ptr,
        sorted_ptr,
        active_ptr,
        count_ptr,
        start_ptr,
        row_ptr,
        rank_ptr,
        K,
        MAX_LORAS,
        stride_xt,
        stride_ar,
        stride_as,
        stride_hs,
        stride_ht,
        N_TILES: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        pid_mn = tl.program_id(0)
        si = tl.program_id(1)
        slot = tl.load(active_ptr + tl.program_id(2))
        if slot == -1:
            return
        n_tok = tl.load(count_ptr + slot)
        pid_m = pid_mn // N_TILES
        pid_n = pid_mn % N_TILES
        if pid_m * BM >= n_tok:
            return
        rank = tl.load(rank_ptr + si * MAX_LORAS + slot)
        if pid_n * BN >= rank:
            return
        start = tl.load(start_ptr + slot)
        row0 = tl.load(row_ptr + slot)
        offs_m = pid_m * BM + tl.arange(0, BM)
        mask_m = offs_m < n_tok
        tok = tl.load(sorted_ptr + start + offs_m, mask=mask_m, other=0).to(tl.int64)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mask_n = offs_n < rank
        rows = (row0 + offs_n).to(tl.int64)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            offs_k = k0 + tl.arange(0, BK)
            mask_k = offs_k < K
            xv = tl.load(
                x_ptr + tok[:, None] * stride_xt + offs_k[None, :],
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            av = tl.load(
                a_ptr + rows[None, :] * stride_ar + si * stride_as + offs_k[:, None],
                mask=mask_n[None, :] & mask_k[:, None],
                other=0.0,
            )
            acc += tl.dot(xv.to(tl.float32), av.to(tl.float32))
        tl.store(
            h_ptr + si * stride_hs + tok[:, None] * stride_ht + offs_n[None, :],
            acc,
            mask=mask_m[:, None] & mask_n[None, :],
        )

    @triton.jit
    def _expand_kernel(
        h_ptr,
        b_ptr,
        y_ptr,
        sorted_ptr,
        active_ptr,
        count_ptr,
        start_ptr,
        row_ptr,
        rank_ptr,
        scale_ptr,
        off_ptr,
        size_ptr,
        MAX_LORAS,
        stride_hs,
        stride_ht,
        stride_br,
        stride_yt,
        N_TILES: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        pid_mn = tl.program_id(0)
        si = tl.program_id(1)
        slot = tl.load(active_ptr + tl.program_id(2))
        if slot == -1:
            return
        n_tok = tl.load(count_ptr + slot)
        pid_m = pid_mn // N_TILES
        pid_n = pid_mn % N_TILES
        if pid_m * BM >= n_tok:
            return
        rank = tl.load(rank_ptr + si * MAX_LORAS + slot)
        if rank == 0:
            return
        size = tl.load(size_ptr + si)
        if pid_n * BN >= size:
            return
        col0 = tl.load(off_ptr + si)
        start = tl.load(start_ptr + slot)
        row0 = tl.load(row_ptr + slot)
        scale = tl.load(scale_ptr + si * MAX_LORAS + slot)
        offs_m = pid_m * BM + tl.arange(0, BM)
        mask_m = offs_m < n_tok
        tok = tl.load(sorted_ptr + start + offs_m, mask=mask_m, other=0).to(tl.int64)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mask_n = offs_n < size
        cols = col0 + offs_n
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, rank, BK):
            offs_k = k0 + tl.arange(0, BK)
            mask_k = offs_k < rank
            hv = tl.load(
                h_ptr + si * stride_hs + tok[:, None] * stride_ht + offs_k[None, :],
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            bv = tl.load(
                b_ptr + (row0 + offs_k).to(tl.int64)[:, None] * stride_br + cols[None, :],
                mask=mask_k[:, None] & mask_n[None, :],
                other=0.0,
            )
            acc += tl.dot(hv, bv.to(tl.float32))
        y_ptrs = y_ptr + tok[:, None] * stride_yt + cols[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
        yv = tl.load(y_ptrs, mask=mask, other=0.0)
        tl.store(y_ptrs, (yv.to(tl.float32) + acc * scale).to(yv.dtype), mask=mask)


def lora_shrink_triton(
    x: torch.Tensor,
    a_buf: torch.Tensor,
    meta: LoraBatchMeta | StaticLoraView,
    lid: int,
    max_rank: int,
) -> torch.Tensor:
    """`h [num_slices, T, max_rank]` (fp32): each token's shrink by its adapter's A, per slice."""
    if not HAS_TRITON:
        raise NotImplementedError("the Triton LoRA kernels need triton installed")
    require_stride1_last("lora_shrink_triton", x=x, a_buf=a_buf)
    num_slices, k = a_buf.shape[1], a_buf.shape[2]
    t = x.shape[0]
    h = torch.empty(num_slices, t, max_rank, dtype=torch.float32, device=x.device)
    n_tiles = triton.cdiv(max_rank, BLOCK_N)
    grid = (triton.cdiv(t, BLOCK_M) * n_tiles, num_slices, meta.max_loras)
    ranks = meta.ranks[lid].contiguous()
    _shrink_kernel[grid](
        x,
        a_buf,
        h,
        meta.sorted_token_ids,
        meta.active_slots,
        meta.slot_num_tokens,
        meta.slot_start,
        meta.slot_row_start,
        ranks,
        k,
        meta.max_loras,
        x.stride(0),
        a_buf.stride(0),
        a_buf.stride(1),
        h.stride(0),
        h.stride(1),
        N_TILES=n_tiles,
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=BLOCK_K,
    )
    return h


def lora_expand_triton(
    h: torch.Tensor,
    b_buf: torch.Tensor,
    y: torch.Tensor,
    meta: LoraBatchMeta | StaticLoraView,
    lid: int,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
    slice_tensors: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """`y[:, slice] += scale * h[slice] @ B[slice]` for every token with an adapter, in place.

    `slice_tensors` (int32 offsets and sizes on y's device), when given, avoids a host copy
    per call (needed inside CUDA-graph capture).
    """
    if not HAS_TRITON:
        raise NotImplementedError("the Triton LoRA kernels need triton installed")
    require_stride1_last("lora_expand_triton", h=h, b_buf=b_buf, y=y)
    num_slices, t = h.shape[0], h.shape[1]
    if slice_tensors is None:
        offs = torch.tensor(list(slice_offsets), dtype=torch.int32, device=y.device)
        sizes = torch.tensor(list(slice_sizes), dtype=torch.int32, device=y.device)
    else:
        offs, sizes = slice_tensors
    n_tiles = triton.cdiv(max(slice_sizes), BLOCK_N)
    grid = (triton.cdiv(t, BLOCK_M) * n_tiles, num_slices, meta.max_loras)
    _expand_kernel[grid](
        h,
        b_buf,
        y,
        meta.sorted_token_ids,
        meta.active_slots,
        meta.slot_num_tokens,
        meta.slot_start,
        meta.slot_row_start,
        meta.ranks[lid].contiguous(),
        meta.scales[lid].contiguous(),
        offs,
        sizes,
        meta.max_loras,
        h.stride(0),
        h.stride(1),
        b_buf.stride(0),
        y.stride(0),
        N_TILES=n_tiles,
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=BLOCK_K,
    )


def lora_delta_triton(
    x: torch.Tensor,
    y: torch.Tensor,
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    meta: LoraBatchMeta,
    lid: int,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
    max_rank: int,
    slice_tensors: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Shrink then expand for one Linear: the Triton twin of `lora_delta_torch`."""
    h = lora_shrink_triton(x, a_buf, meta, lid, max_rank)
    lora_expand_triton(h, b_buf, y, meta, lid, slice_offsets, slice_sizes, slice_tensors)


def lora_delta_triton_static(
    x: torch.Tensor,
    y: torch.Tensor,
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    meta: StaticLoraView,
    lid: int,
    slice_sizes: Sequence[int],
    slice_tensors: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """The CUDA-graph-capturable delta: `lora_delta_triton` over static metadata buffers.

    Every launch parameter is fixed for the capture: the grid comes from the (padded) batch
    `x.shape[0]`, `meta.max_rank` (the runtime's `max_lora_rank`), the Linear's shape and
    `meta.max_loras`; which adapters run, their token counts and ranks are read on the
    device, so replaying with new buffer contents needs no host read and no new launch.
    """
    if not HAS_TRITON:
        raise NotImplementedError("the graph-static LoRA path needs triton installed")
    if x.shape[0] != meta.num_tokens:
        raise ValueError(f"x has {x.shape[0]} rows, the static metadata {meta.num_tokens}")
    h = lora_shrink_triton(x, a_buf, meta, lid, meta.max_rank)
    lora_expand_triton(h, b_buf, y, meta, lid, (), slice_sizes, slice_tensors)


class TritonLora:
    """The Triton shrink/expand as a `LoraBackend` (CUDA), with the graph-static form for
    captured decode steps (`static_delta`)."""

    name = "triton"

    def __init__(self, bounds: SliceBounds, max_rank: int) -> None:
        self.bounds = bounds
        self.max_rank = max_rank

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
        lora_delta_triton(
            x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes,
            self.max_rank, self.bounds.get(lid),
        )  # fmt: skip

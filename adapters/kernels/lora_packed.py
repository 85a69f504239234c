"""The packed CPU LoRA path: each step's chunk weights gathered once, reused by every step after.

`lora_sgmv` gathers each chunk's A and B rows from the pool in every Linear of every step, and
expands slice by slice: about fifteen small ops per Linear. On a CPU those ops cost far more
than their arithmetic (a bf16 GEMM of 64 x 256 x 24 takes ~30 us, in fp32 ~5-15 us), so a
rank-8 adapter added 30-60% to a decode step of a hidden-256 model. Here a Linear's chunk
weights are packed once per adapter layout (`pack_linear`): A as `[K, in, S*R]` and B as a
block-diagonal `[K, S*R, out]` (slice `s`'s rank rows write only its columns; per slice
instead when that grows past a cache-sized bound), scales folded into B, rows past each
adapter's own rank zeroed. The delta is then two batched GEMMs and one add
(`lora_delta_packed`), plus a gather in and out when the adapter tokens are not one run.
Packs depend only on which adapter owns each chunk (`SgmvPlan.chunk_adapters`): a decode
batch keeps its layout from step to step, so `PackCache` rebuilds them only when it changes.

The arithmetic runs in fp32 when activations are 16-bit on a CPU (small bf16 GEMMs are 2-5x
slower than fp32 ones there), and the delta is added into the output once, rounded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.kernels.lora_sgmv import SgmvPlan, step_plan
from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.loader.tensor_layout import require_contiguous, require_stride1_last

# A block-diagonal B past this size (many chunks, wide outputs) costs more memory traffic than
# the GEMM per slice it saves: then B is packed per slice.
BLOCK_DIAGONAL_MAX_BYTES = 512 << 10


def lora_compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of the packed path's GEMMs: fp32 for 16-bit activations on a CPU."""
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return x.dtype


@dataclass(frozen=True)
class PackedLinear:
    """One Linear's chunk weights: A `[K, in, S*R]`, and B either block-diagonal `[K, S*R, out]`
    (`b` has one tensor) or one `[K, R, size]` per slice (`b` has S tensors)."""

    a: torch.Tensor
    b: tuple[torch.Tensor, ...]
    slice_offsets: tuple[int, ...]
    slice_sizes: tuple[int, ...]

    @property
    def block_diagonal(self) -> bool:
        """Whether one GEMM expands every slice (B block-diagonal)."""
        return len(self.b) == 1

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in (self.a, *self.b))


def pack_linear(
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    plan: SgmvPlan,
    lid: int,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
    dtype: torch.dtype,
) -> PackedLinear:
    """Linear `lid`'s chunk weights for `plan`: A `[K, in, S*R]`, B scaled, rows past each
    chunk's adapter zeroed; B block-diagonal when it stays within `BLOCK_DIAGONAL_MAX_BYTES`.

    `a_buf` is the pool's `[rows, S, in]` A buffer, `b_buf` its `[rows, out]` transposed B.
    Column `s * R + j` of A is rank row j of slice s.
    """
    require_contiguous("pack_linear", a_buf=a_buf, b_buf=b_buf)
    k, r = plan.num_chunks, plan.rank
    ns, d_in, out = a_buf.shape[1], a_buf.shape[2], b_buf.shape[1]
    offsets, sizes = tuple(slice_offsets), tuple(slice_sizes)
    rank_mask = plan.mask[:, 0, :, 0].to(dtype)  # [K, R]: a chunk's first row is a real token
    a = a_buf.index_select(0, plan.row_index).view(k, r, ns, d_in).to(dtype)
    a = (a * rank_mask.view(k, r, 1, 1)).permute(0, 3, 2, 1).reshape(k, d_in, ns * r)
    b = b_buf.index_select(0, plan.row_index).view(k, r, out).to(dtype)
    b = b * rank_mask.view(k, r, 1)
    scales = plan.scales[lid, :, 0, 0, :ns].to(dtype)  # [K, S]
    if ns == 1:
        return PackedLinear(
            a.contiguous(), ((b * scales.view(k, 1, 1)).contiguous(),), offsets, sizes
        )
    elem = torch.empty((), dtype=dtype).element_size()
    if k * ns * r * out * elem > BLOCK_DIAGONAL_MAX_BYTES:
        per_slice = tuple(
            (b[:, :, off : off + size] * scales[:, si].view(k, 1, 1)).contiguous()
            for si, (off, size) in enumerate(zip(offsets, sizes, strict=True))
        )
        return PackedLinear(a.contiguous(), per_slice, offsets, sizes)
    bd = torch.zeros(k, ns * r, out, dtype=dtype, device=b.device)
    for si, (off, size) in enumerate(zip(offsets, sizes, strict=True)):
        scale = scales[:, si].view(k, 1, 1)
        bd[:, si * r : (si + 1) * r, off : off + size] = b[:, :, off : off + size] * scale
    return PackedLinear(a.contiguous(), (bd,), offsets, sizes)


def lora_delta_packed(
    x: torch.Tensor, y: torch.Tensor, packed: PackedLinear, plan: SgmvPlan
) -> None:
    """Add every adapter token's delta into `y` [T, out] in place, from `pack_linear`'s weights.

    Padding rows of a chunk compute garbage that no token reads back.
    """
    require_stride1_last("lora_delta_packed", x=x, y=y)
    k, c = plan.num_chunks, plan.chunk_size
    a = packed.a
    d_in = a.shape[1]
    start = plan.run_start
    run = start is not None  # the chunks are one run of tokens: views, no gather
    if start is not None:
        s, e = start, start + k * c
        xg = x[s:e]
    else:
        xg = x.index_select(0, plan.tok_index)
    h = torch.bmm(xg.to(a.dtype).view(k, c, d_in), a)
    if packed.block_diagonal:
        parts = [(torch.bmm(h, packed.b[0]), y)]
    else:
        r = h.shape[2] // len(packed.b)
        parts = [
            (torch.bmm(h[:, :, si * r : (si + 1) * r], b), y[:, off : off + size])
            for si, (b, off, size) in enumerate(
                zip(packed.b, packed.slice_offsets, packed.slice_sizes, strict=True)
            )
        ]
    for d, out in parts:
        d = d.view(k * c, -1)
        if run:
            out[s:e].add_(d)
            continue
        d = d.index_select(0, plan.inv_index)
        out.add_(d if plan.token_mask is None else d.mul_(plan.token_mask))


class PackCache:
    """Packed weights of every Linear for the latest adapter layout, within a byte budget.

    A layout is the plan's `chunk_adapters` (adapter versions' keys and pool rows: a version's
    weights never change, and moved rows change the key). Past `max_bytes` nothing is kept and
    each call packs afresh (same result, the gather cost of `lora_sgmv`).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._layout: tuple[tuple[tuple[str, int, int], ...], int, torch.dtype] | None = None
        self._packs: dict[int, PackedLinear] = {}
        self._bytes = 0

    def get(
        self,
        lid: int,
        a_buf: torch.Tensor,
        b_buf: torch.Tensor,
        plan: SgmvPlan,
        slice_offsets: Sequence[int],
        slice_sizes: Sequence[int],
        dtype: torch.dtype,
    ) -> PackedLinear:
        """Linear `lid`'s packed weights for `plan`'s layout, packed now if not cached."""
        layout = (plan.chunk_adapters, plan.rank, dtype)
        if layout != self._layout:
            self._layout, self._packs, self._bytes = layout, {}, 0
        packed = self._packs.get(lid)
        if packed is None:
            packed = pack_linear(a_buf, b_buf, plan, lid, slice_offsets, slice_sizes, dtype)
            if self._bytes + packed.nbytes <= self.max_bytes:
                self._packs[lid] = packed
                self._bytes += packed.nbytes
        return packed


class PackedLora:
    """The packed CPU path as a `LoraBackend`: chunk weights packed once per adapter layout and
    kept (within `pack_cache_bytes`) while decode steps repeat it."""

    name = "packed"

    def __init__(self, pack_cache_bytes: int = 256 << 20) -> None:
        self.packs = PackCache(pack_cache_bytes)

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
        dtype = lora_compute_dtype(x)
        plan = step_plan(meta, pool.num_rows, dtype)
        if plan is None:  # the active adapters have no tokens this step
            return
        a, b = pool.a[lid], pool.b[lid]
        packed = self.packs.get(lid, a, b, plan, spec.slice_offsets, spec.slice_sizes, dtype)
        lora_delta_packed(x, y, packed, plan)

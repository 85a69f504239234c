"""The gathered (SGMV-style) torch LoRA path: a step's cost set by tokens and ranks, not adapters.

Per step, once (`build_sgmv_plan`): the adapter tokens, already grouped by adapter in
`sorted_token_ids`, are cut into *chunks* of at most `C` tokens of one adapter, with
`C = ceil(adapter tokens / active adapters)`, so there are at most `2 x adapters` chunks and
at most `2 x tokens` padded rows. Each chunk carries its adapter's pool rows.

Per Linear (`lora_delta_sgmv`): gather every chunk's A and B rows (one `index_select` each),
gather the chunk tokens (one more), one `bmm` to shrink, one mask-and-scale, one `bmm` per
fused slice to expand, and one gather back to token order added into the output (a gather,
not a scatter: `index_add_` on CPU is several times slower, worst in bf16). No Python loop over
adapters or tokens: 32 distinct adapters cost what 32 tokens of one adapter split in 32 chunks
would, and the work grows with tokens x rank only. Punica's BGMV/SGMV and S-LoRA gather the
same way on a GPU; this is the CPU twin, in plain torch ops. The engine runs the packed
variant (`lora_packed`: the same plan, chunk weights gathered once per adapter layout);
`lora_delta_sgmv` stays as the per-call reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.loader.tensor_layout import require_contiguous, require_stride1_last


@dataclass
class SgmvPlan:
    """One step's chunking of adapter tokens (built once, read by every Linear)."""

    num_chunks: int  # K
    chunk_size: int  # C
    rank: int  # R: the largest active adapter's rows
    tok_index: torch.Tensor  # [K * C] int64 token of each padded chunk row (padding: 0)
    row_index: torch.Tensor  # [K * R] int64 pool row of each chunk rank row (clamped)
    inv_index: torch.Tensor  # [T] int64: each token's padded chunk row (base tokens: 0)
    token_mask: torch.Tensor | None  # [T, 1]: 1 for adapter tokens; None when all are
    mask: torch.Tensor  # [K, C, R, 1]: 1 for a real token x a rank row of its adapter
    scales: torch.Tensor  # [num_linears, K, 1, 1, max_slices]: each chunk's adapter's scales
    # Each chunk's adapter (key, first pool row, rows): what its gathered weights depend on.
    chunk_adapters: tuple[tuple[str, int, int], ...] = ()
    # When the chunks are exactly tokens run_start.. run_start + K * C in order (no padding, no
    # base token between), the packed path reads and writes that slice with no gather.
    run_start: int | None = None


def build_sgmv_plan(
    meta: LoraBatchMeta, num_pool_rows: int, dtype: torch.dtype = torch.float32
) -> SgmvPlan | None:
    """Chunk the step's adapter tokens (None when no token uses an adapter); masks and
    scales come in `dtype`, the compute dtype, so no Linear converts them again."""
    groups = meta.groups
    if not groups:
        return None
    dev = meta.token_slot.device
    n_active = len(groups)
    counts = torch.tensor([g.num_tokens for g in groups], dtype=torch.int64)
    total = int(counts.sum())
    if total == 0:
        return None
    c = max(1, math.ceil(total / n_active))
    per_slot_chunks = (counts + c - 1) // c
    k = int(per_slot_chunks.sum())
    rank = max(1, max(g.rows for g in groups))

    sorted_tok = meta.sorted_token_ids[:total].to(dev, torch.int64)
    slot_of_sorted = torch.repeat_interleave(torch.arange(n_active), counts)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(total) - starts[slot_of_sorted]
    chunk_base = torch.cumsum(per_slot_chunks, 0) - per_slot_chunks
    chunk_id = chunk_base[slot_of_sorted] + pos // c
    flat = (chunk_id * c + pos % c).to(dev)
    tok_index = torch.zeros(k * c, dtype=torch.int64, device=dev)
    tok_index[flat] = sorted_tok
    valid = torch.zeros(k * c, dtype=torch.float32, device=dev)
    valid[flat] = 1.0
    inv_index = torch.zeros(meta.num_tokens, dtype=torch.int64, device=dev)
    inv_index[sorted_tok] = flat
    token_mask = None
    if total < meta.num_tokens:
        token_mask = torch.zeros(meta.num_tokens, 1, dtype=dtype, device=dev)
        token_mask[sorted_tok] = 1

    chunk_slot = torch.repeat_interleave(torch.arange(n_active), per_slot_chunks)
    row_start = torch.tensor([g.row_start for g in groups], dtype=torch.int64)[chunk_slot]
    rows = torch.tensor([g.rows for g in groups], dtype=torch.int64)[chunk_slot]
    ar = torch.arange(rank)
    row_index = (row_start[:, None] + ar).clamp(max=num_pool_rows - 1).reshape(-1).to(dev)
    rmask = (ar[None, :] < rows[:, None]).to(torch.float32).to(dev)  # [K, R]
    mask = (valid.view(k, c, 1) * rmask.view(k, 1, rank)).to(dtype)[..., None]
    scales = meta.scales.to(dev)[:, :, chunk_slot.to(dev)].permute(0, 2, 1)  # [L, K, S]
    scales = scales.to(dtype)[:, :, None, None, :].contiguous()
    keys = [(g.key, g.row_start, g.rows) for g in groups]
    chunk_adapters = tuple(keys[i] for i in chunk_slot.tolist())
    run_start = None
    if k * c == total:  # no padding: the chunks are the sorted tokens in order
        first = int(sorted_tok[0])
        if torch.equal(sorted_tok.cpu(), torch.arange(first, first + total)):
            run_start = first
    return SgmvPlan(
        k, c, rank, tok_index, row_index, inv_index, token_mask, mask, scales,
        chunk_adapters, run_start,
    )  # fmt: skip


def step_plan(meta: LoraBatchMeta, num_pool_rows: int, dtype: torch.dtype) -> SgmvPlan | None:
    """The step's plan, built by the first Linear that needs it and kept on `meta` for the rest
    (None when no token uses an adapter)."""
    if meta.sgmv_plan is None:
        meta.sgmv_plan = build_sgmv_plan(meta, num_pool_rows, dtype)
    plan = meta.sgmv_plan
    assert plan is None or isinstance(plan, SgmvPlan)  # only this function sets it
    return plan


def lora_delta_sgmv(
    x: torch.Tensor,
    y: torch.Tensor,
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    plan: SgmvPlan,
    lid: int,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
) -> None:
    """Add every adapter token's delta for Linear `lid` into `y` [T, out] in place.

    `a_buf` is the pool's `[rows, num_slices, in]` A buffer, `b_buf` its `[rows, out]`
    transposed-B buffer for this Linear; `x` [T, in] the Linear's input.
    """
    require_stride1_last("lora_delta_sgmv", x=x, y=y)
    require_contiguous("lora_delta_sgmv", a_buf=a_buf, b_buf=b_buf)
    k, c, r = plan.num_chunks, plan.chunk_size, plan.rank
    ns, d_in = a_buf.shape[1], a_buf.shape[2]
    a = a_buf.index_select(0, plan.row_index).view(k, r * ns, d_in)
    xg = x.index_select(0, plan.tok_index).view(k, c, d_in)
    h = torch.bmm(xg, a.transpose(1, 2)).view(k, c, r, ns)
    h.mul_(plan.mask).mul_(plan.scales[lid, ..., :ns])
    b = b_buf.index_select(0, plan.row_index).view(k, r, -1)
    # slice-major and contiguous, so each slice's expand is a plain batched GEMM (a strided
    # slice makes CPU `bmm` fall back to one copy and one matmul per chunk)
    hs_all = h.view(k, c, r) if ns == 1 else h.permute(3, 0, 1, 2).contiguous()
    for si, (off, size) in enumerate(zip(slice_offsets, slice_sizes, strict=True)):
        hs = hs_all if ns == 1 else hs_all[si]
        d = torch.bmm(hs, b if ns == 1 else b[:, :, off : off + size]).view(k * c, size)
        d = d.index_select(0, plan.inv_index)  # back to token order
        out = y if ns == 1 else y[:, off : off + size]
        if plan.token_mask is None:
            out.add_(d)
        else:
            out.addcmul_(d, plan.token_mask)


class SgmvLora:
    """Plain SGMV as a `LoraBackend` (chunk weights gathered in every call)."""

    name = "sgmv"

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
        plan = step_plan(meta, pool.num_rows, x.dtype)
        if plan is not None:
            lora_delta_sgmv(
                x, y, pool.a[lid], pool.b[lid], plan, lid, spec.slice_offsets, spec.slice_sizes
            )

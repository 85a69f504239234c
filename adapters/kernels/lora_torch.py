"""The torch path of the batched LoRA delta (what runs on CPU).

For one Linear and one step: for each *active adapter* (never each token), shrink its tokens
`h = x @ A^T` with one matmul over all fused slices, then expand per slice
`y[:, slice] += scale * h @ B^T` in place. An adapter whose tokens form one contiguous run
(a prefill chunk, a lone decode) reads and writes views with no gather; otherwise its tokens
are gathered once and scattered back with `index_add_`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraplex.adapters.metadata import LoraBatchMeta


def lora_delta_torch(
    x: torch.Tensor,
    y: torch.Tensor,
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    meta: LoraBatchMeta,
    lid: int,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
) -> None:
    """Add every active adapter's delta for Linear `lid` into `y` [T, out] in place.

    `a_buf` is the pool's `[rows, num_slices, in]` A buffer and `b_buf` its `[rows, out]`
    transposed-B buffer for this Linear; `x` is the Linear's input [T, in].
    """
    num_slices = a_buf.shape[1]
    for g in meta.groups:
        ranks = g.ranks[lid]
        rmax = max(ranks)
        if rmax == 0:
            continue
        rs = g.row_start
        targeted = [si for si in range(num_slices) if ranks[si] > 0]
        if len(g.runs) == 1:
            s, e = g.runs[0]
            xg, idx = x[s:e], None
        else:
            idx = g.token_idx
            xg = x.index_select(0, idx)
        if len(targeted) == 1:
            si = targeted[0]
            hs = {si: xg @ a_buf[rs : rs + ranks[si], si].t()}
        else:
            h = (xg @ a_buf[rs : rs + rmax].reshape(rmax * num_slices, -1).t()).view(
                -1, rmax, num_slices
            )
            hs = {si: h[:, : ranks[si], si] for si in targeted}
        for si, hsi in hs.items():
            off, size = slice_offsets[si], slice_sizes[si]
            b = b_buf[rs : rs + ranks[si], off : off + size]
            scale = g.scales[lid][si]
            if idx is None:
                y[s:e, off : off + size].addmm_(hsi, b, alpha=scale)
            else:
                y[:, off : off + size].index_add_(0, idx, hsi @ b, alpha=scale)


def lora_delta_torch_bmm(
    x: torch.Tensor,
    y: torch.Tensor,
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    meta: LoraBatchMeta,
    lid: int,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
) -> None:
    """The gather/bmm alternative to `lora_delta_torch`: no Python loop at all.

    Gathers every adapter token's A and B rows (padded to the step's largest rank, masked)
    and contracts them per token. It copies each token's adapter weights, so it moves more
    bytes than the per-adapter loop; kept to measure against it (`loraplex bench lora`).
    """
    n = int(meta.slot_num_tokens.sum())
    if n == 0:
        return
    dev = x.device
    tok = meta.sorted_token_ids[:n].long()
    slot = meta.token_slot.to(dev)[tok].long()
    ranks = meta.ranks[lid].to(dev)  # [max_slices, L]
    r_tok = ranks.max(0).values[slot]  # [N]
    r = int(r_tok.max())
    if r == 0:
        return
    ar = torch.arange(r, device=dev)
    idx = meta.slot_row_start.to(dev)[slot].long()[:, None] + ar  # [N, R]
    mask = (ar < r_tok[:, None]).to(x.dtype)
    idx = idx.clamp(max=a_buf.shape[0] - 1)
    a = a_buf[idx] * mask[:, :, None, None]  # [N, R, S, in]
    h = torch.einsum("nrsi,ni->nsr", a, x.index_select(0, tok))
    num_slices = a_buf.shape[1]
    h = h * meta.scales[lid, :num_slices].to(dev, x.dtype)[:, slot].t()[:, :, None]
    b = b_buf[idx] * mask[:, :, None]  # [N, R, out]
    for si, (off, size) in enumerate(zip(slice_offsets, slice_sizes, strict=True)):
        d = torch.einsum("nr,nro->no", h[:, si], b[:, :, off : off + size])
        y[:, off : off + size].index_add_(0, tok, d)


# A step's adapters run as one stacked matmul when the extra (masked-out) work is below this
# many multiply-adds per Linear: at small batches a few big ops beat many tiny ones on CPU.
DENSE_MAX_MACS = 1 << 24


def dense_is_cheaper(
    meta: LoraBatchMeta, num_tokens: int, in_features: int, out: int, ns: int
) -> bool:
    """Should this Linear take the stacked path (`lora_delta_torch_dense`) this step?

    Worth it when the per-adapter loop would gather/scatter (several adapters, or one adapter
    in several runs) and the stacked matmuls stay small.
    """
    groups = meta.groups
    if not groups or (len(groups) == 1 and len(groups[0].runs) == 1):
        return False
    rsum = sum(g.rows for g in groups)
    return num_tokens * rsum * (ns * in_features + out) <= DENSE_MAX_MACS


def stack_dense_weights(
    a_buf: torch.Tensor,
    b_buf: torch.Tensor,
    meta: LoraBatchMeta,
    lid: int,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Copy the step's adapters' rows of Linear `lid` into stacked weights.

    Returns A `[num_slices * R, in]` (rows ordered slice, adapter, rank; R = the groups' rows
    summed) and per slice B `[R, size]` with each adapter's scale folded in. Pool rows past an
    adapter's rank are zero, so they add nothing.
    """
    num_slices = a_buf.shape[1]
    a_parts: list[torch.Tensor] = []
    b_out: list[torch.Tensor] = []
    for si in range(num_slices):
        off, size = slice_offsets[si], slice_sizes[si]
        b_parts = []
        for g in meta.groups:
            rows = slice(g.row_start, g.row_start + g.rows)
            a_parts.append(a_buf[rows, si])
            b_parts.append(b_buf[rows, off : off + size] * g.scales[lid][si])
        b_out.append(torch.cat(b_parts))
    return torch.cat(a_parts), b_out


def dense_token_mask(meta: LoraBatchMeta, dtype: torch.dtype) -> torch.Tensor:
    """[T, R] with 1 where token t belongs to the adapter owning stacked column r (else 0)."""
    dev = meta.token_slot.device
    sizes = torch.tensor([g.rows for g in meta.groups], device=dev)
    col_slot = torch.repeat_interleave(torch.arange(len(meta.groups), device=dev), sizes)
    return (meta.token_slot[:, None] == col_slot[None, :].to(meta.token_slot.dtype)).to(dtype)


def lora_delta_torch_dense(
    x: torch.Tensor,
    y: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: Sequence[torch.Tensor],
    mask: torch.Tensor,
    slice_offsets: Sequence[int],
    slice_sizes: Sequence[int],
) -> None:
    """Every adapter's delta in `2 + num_slices` ops: shrink against all stacked adapters,
    zero each token's columns of other adapters, expand per slice into `y` in place."""
    ns, rsum = len(b_stack), mask.shape[1]
    h = (x @ a_stack.t()).view(-1, ns, rsum)
    h.mul_(mask[:, None, :])
    if ns == 1:
        y.addmm_(h[:, 0], b_stack[0])
        return
    for si in range(ns):
        off, size = slice_offsets[si], slice_sizes[si]
        y[:, off : off + size].addmm_(h[:, si], b_stack[si])

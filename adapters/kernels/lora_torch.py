"""The per-adapter torch path of the batched LoRA delta (CPU; the reference the others match).

For one Linear and one step: for each *active adapter* (never each token), shrink its tokens
`h = x @ A^T` with one matmul over all fused slices, then expand per slice
`y[:, slice] += scale * h @ B^T` in place. An adapter whose tokens form one contiguous run
(a prefill chunk, a lone decode) reads and writes views with no gather; otherwise its tokens
are gathered once and scattered back with `index_add_`. The engine runs it only when one
adapter owns one contiguous run (views, no copies); mixed batches take `lora_sgmv`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
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
            assert idx is not None  # more than one run: the group carries its token indices
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


class TorchLora:
    """The per-adapter torch path as a `LoraBackend` (the reference the others match)."""

    name = "torch"

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
        lora_delta_torch(
            x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes
        )

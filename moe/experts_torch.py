"""The CPU expert path: one matmul pair per *active* expert over its contiguous rows.

Pairs (token, k) are sorted by expert once; each expert with work then gathers its rows into
a small reused buffer and runs gate/up -> SiLU-and-mul -> down while they are in cache, its
outputs landing in sorted pair order. At decode sizes one sorted copy of every pair costs
fewer small ops instead (`SORTED_COPY_BYTES`). One weighted gather-and-sum per token
(`embedding_bag`: fp32 accumulation, one rounding) then combines each token's top-k rows,
where a per-expert weighted scatter into an fp32 buffer cost a widening multiply and an
`index_add_` per expert. No loop over tokens, no scan of all tokens per expert. Each stack's
matmul is bound once per call (`bind_expert_mm`), not dispatched per expert.

Weights follow transformers v5's fused layout: `w13` [E, 2I, H] (gate rows then up
rows), `w2` [E, H, I]; either may be a `QuantizedExperts` stack (int8 / int4 / fp8), whose
`matmul` runs one expert's rows through PyTorch's packed CPU kernels, or a `PackedExperts`
stack (float experts packed for oneDNN at load on a CPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from loraplex.moe.packed_experts import PackedExperts
from loraplex.moe.quant_experts import QuantizedExperts

ExpertWeights = torch.Tensor | QuantizedExperts | PackedExperts

SORTED_COPY_BYTES = 1 << 20
"""Up to this size of the sorted copy of every pair (about a core's L2: decode batches), one
gather beats per-expert ones (fewer small ops); past it the copy spills to memory and
per-expert gathers into a reused buffer win (`loraplex bench moe`, both sizes)."""


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up over the last dim split in halves [gate | up]."""
    half = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :half]) * gate_up[..., half:]


def expert_mm(x: torch.Tensor, w: ExpertWeights, expert: int) -> torch.Tensor:
    """x [M, K] @ w[expert]^T."""
    if isinstance(w, PackedExperts):
        return w.matmul(x.contiguous(), expert)
    if isinstance(w, QuantizedExperts):
        return w.matmul(x, expert)
    return torch.mm(x, w[expert].t())


ExpertMatmul = Callable[[torch.Tensor, int, torch.Tensor | None], torch.Tensor]
"""(x [M, K] contiguous, expert, out [M, N] or None) -> x @ W_expert^T, in `out` when given."""

_NO_SCALARS = (None,)


def bind_expert_mm(w: ExpertWeights, dtype: torch.dtype) -> ExpertMatmul:
    """`expert_mm` bound to one stack for a loop over experts, writing into `out` when given.

    A packed stack in the rows' dtype calls oneDNN's packed matmul directly (no per-call
    checks: rows come contiguous from the loop's buffers); a plain stack multiplies straight
    into `out` (no result to copy); anything else goes through `expert_mm`.
    """
    if isinstance(w, PackedExperts) and w.dtype == dtype:
        packed, linear = w.packed, torch.ops.mkldnn._linear_pointwise

        def packed_mm(x: torch.Tensor, expert: int, out: torch.Tensor | None) -> torch.Tensor:
            y: torch.Tensor = linear(x, packed[expert], None, "none", _NO_SCALARS, "")
            return y if out is None else out.copy_(y)

        return packed_mm
    if isinstance(w, torch.Tensor):
        plain = w

        def plain_mm(x: torch.Tensor, expert: int, out: torch.Tensor | None) -> torch.Tensor:
            if out is None:
                return torch.mm(x, plain[expert].t())
            return torch.mm(x, plain[expert].t(), out=out)

        return plain_mm

    def other_mm(x: torch.Tensor, expert: int, out: torch.Tensor | None) -> torch.Tensor:
        y = expert_mm(x, w, expert)
        return y if out is None else out.copy_(y)

    return other_mm


def check_expert_weights(hidden: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights) -> None:
    """Refuse expert stacks whose shapes do not fit each other or the hidden size."""
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError("expert weights must be 3-D: w13 [E, 2I, H], w2 [E, H, I]")
    num, two_i, h = w13.shape
    if h != hidden.shape[-1] or two_i % 2 or w2.shape != (num, h, two_i // 2):
        raise ValueError(
            f"expert weight shapes w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)} do not fit "
            f"hidden size {hidden.shape[-1]}"
        )


def expert_mlp(
    rows: torch.Tensor,
    gate_up_mm: ExpertMatmul,
    down_mm: ExpertMatmul,
    expert: int,
    act_buf: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """One expert's MLP over its rows [n, H] into `out` [n, H]; `act_buf` [>=n, I] holds the
    activation.

    SiLU runs in place on the gate half and the product lands contiguous in `act_buf`, so the
    down projection reads one dense block (a packed oneDNN matmul would otherwise copy it).
    """
    count, half = rows.shape[0], act_buf.shape[1]
    gate_up = gate_up_mm(rows, expert, None)
    gate = gate_up[:, :half]
    F.silu(gate, inplace=True)
    act = torch.mul(gate, gate_up[:, half:], out=act_buf[:count])
    return down_mm(act, expert, out)


def run_sorted_rows(
    rows: torch.Tensor, counts: list[int], w13: ExpertWeights, w2: ExpertWeights
) -> torch.Tensor:
    """Expert MLP over rows already grouped by local expert (`counts[e]` rows each, in order).

    Rows past sum(counts) (e.g. pairs for experts held elsewhere) come back as zeros.
    """
    total = sum(counts)
    out = rows.new_empty(rows.shape)
    out[total:].zero_()
    act_buf = rows.new_empty(max(counts, default=0), w2.shape[2])
    gate_up_mm, down_mm = bind_expert_mm(w13, rows.dtype), bind_expert_mm(w2, rows.dtype)
    pieces = zip(rows[:total].split(counts), out[:total].split(counts), strict=True)
    for expert, (seg, dest) in enumerate(pieces):
        if seg.shape[0]:
            expert_mlp(seg, gate_up_mm, down_mm, expert, act_buf, dest)
    return out


def expert_rows_torch(
    rows: torch.Tensor, local_ids: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights
) -> torch.Tensor:
    """Unweighted expert output per row: row i goes through local expert `local_ids[i]`."""
    check_expert_weights(rows, w13, w2)
    num_local = w13.shape[0]
    if rows.shape[0] == 0:
        return rows.new_zeros(rows.shape)
    order = torch.argsort(local_ids, stable=True)
    counts = torch.bincount(local_ids, minlength=num_local)
    if counts.numel() > num_local:
        raise ValueError(f"local expert id out of range for {num_local} experts")
    out_sorted = run_sorted_rows(rows[order], counts.tolist(), w13, w2)
    out = torch.empty_like(out_sorted)
    out[order] = out_sorted
    return out


def fused_experts_torch(
    hidden: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_k weight[t, k] * Expert_{id[t, k]}(hidden[t]) for every token t: [T, H].

    `expert_map` ([E_global] int64) maps global ids to rows of `w13`/`w2`, -1 for experts
    held on another rank (those pairs contribute nothing here).
    """
    check_expert_weights(hidden, w13, w2)
    top_k = topk_ids.shape[1]
    num_local = w13.shape[0]
    local = topk_ids if expert_map is None else expert_map[topk_ids]
    # Experts held elsewhere go to an extra bucket past the local ones and are skipped.
    flat = torch.where(local < 0, num_local, local).reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_local + 1)
    if counts.numel() > num_local + 1:
        raise ValueError(f"expert id out of range for {num_local} local experts")
    token_of_pair = order // top_k
    count_list = counts[:num_local].tolist()
    if token_of_pair.numel() * hidden.shape[1] * hidden.element_size() <= SORTED_COPY_BYTES:
        rows_out = run_sorted_rows(hidden[token_of_pair], count_list, w13, w2)
    else:
        rows_out = _run_gathered_rows(hidden, token_of_pair, count_list, w13, w2)
    return weighted_pair_sum(rows_out, order, topk_weights)


def weighted_pair_sum(
    rows_out: torch.Tensor, order: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """out[t] = sum_k weight[t, k] * rows_out[i] where sorted row i holds pair (t, k), i.e.
    `order[i] == t * top_k + k`: [T, H] in rows_out's dtype.

    One fused weighted gather-and-sum (`embedding_bag`, which accumulates in fp32 and rounds
    once) instead of widening, weighting and scattering every row into an fp32 buffer. The
    weights are cast to the rows' dtype first, as transformers' MoE blocks do.
    """
    num_tokens, top_k = topk_weights.shape
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), device=order.device)
    return F.embedding_bag(
        pos.view(num_tokens, top_k),
        rows_out,
        per_sample_weights=topk_weights.to(rows_out.dtype),
        mode="sum",
    )


def _run_gathered_rows(
    hidden: torch.Tensor,
    token_of_pair: torch.Tensor,
    counts: list[int],
    w13: ExpertWeights,
    w2: ExpertWeights,
) -> torch.Tensor:
    """Many pairs (prefill): per expert, gather its rows into a small reused buffer and run
    its MLP while they are in cache; results land in sorted pair order (remote pairs zero)."""
    out = hidden.new_empty(token_of_pair.shape[0], hidden.shape[1])
    local = sum(counts)  # pairs past these go to experts held elsewhere
    out[local:].zero_()
    most = max(counts, default=0)
    rows_buf = hidden.new_empty(most, hidden.shape[1])
    act_buf = hidden.new_empty(most, w2.shape[2])
    gate_up_mm, down_mm = bind_expert_mm(w13, hidden.dtype), bind_expert_mm(w2, hidden.dtype)
    pieces = zip(token_of_pair[:local].split(counts), out[:local].split(counts), strict=True)
    for expert, (tokens, dest) in enumerate(pieces):
        count = tokens.shape[0]
        if count:
            rows = torch.index_select(hidden, 0, tokens, out=rows_buf[:count])
            expert_mlp(rows, gate_up_mm, down_mm, expert, act_buf, dest)
    return out

"""The CPU expert path: one matmul pair per *active* expert over its contiguous rows.

Pairs (token, k) are sorted by expert once; each expert with work then runs
gate/up -> SiLU-and-mul -> down on one contiguous slice, and a single `index_add_`
combines the weighted rows per token. No loop over tokens, no scan of all tokens per expert.

Weights follow transformers v5's fused layout: `w13` [E, 2I, H] (gate rows then up
rows), `w2` [E, H, I]; either may be a `QuantizedExperts` stack (int8 / int4 / fp8), whose
`matmul` runs one expert's rows through PyTorch's packed CPU kernels, or a `PackedExperts`
stack (float experts packed for oneDNN at load on a CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loraplex.moe.packed_experts import PackedExperts
from loraplex.moe.quant_experts import QuantizedExperts

ExpertWeights = torch.Tensor | QuantizedExperts | PackedExperts


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


def run_sorted_rows(
    rows: torch.Tensor, counts: list[int], w13: ExpertWeights, w2: ExpertWeights
) -> torch.Tensor:
    """Expert MLP over rows already grouped by local expert (`counts[e]` rows each, in order).

    Rows past sum(counts) (e.g. pairs for experts held elsewhere) come back as zeros.
    """
    total = sum(counts)
    out = rows.new_empty(rows.shape)
    out[total:].zero_()
    half = w2.shape[2]
    start = 0
    for expert, count in enumerate(counts):
        if count:
            gate_up = expert_mm(rows[start : start + count], w13, expert)
            act = gate_up[:, :half]
            F.silu(act, inplace=True)
            act.mul_(gate_up[:, half:])  # SiLU-and-mul in place, no extra buffers
            if isinstance(w2, QuantizedExperts | PackedExperts):
                out[start : start + count] = expert_mm(act, w2, expert)
            else:
                torch.mm(act, w2[expert].t(), out=out[start : start + count])
        start += count
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
    num_tokens, top_k = topk_ids.shape
    num_local = w13.shape[0]
    local = topk_ids if expert_map is None else expert_map[topk_ids]
    # Experts held elsewhere go to an extra bucket past the local ones and are skipped.
    flat = torch.where(local < 0, num_local, local).reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_local + 1)
    if counts.numel() > num_local + 1:
        raise ValueError(f"expert id out of range for {num_local} local experts")
    token_of_pair = order // top_k
    out_sorted = run_sorted_rows(hidden[token_of_pair], counts[:num_local].tolist(), w13, w2)
    weights = topk_weights.reshape(-1)[order].to(torch.float32).unsqueeze(1)
    weighted = out_sorted.to(torch.float32).mul_(weights)  # out_sorted is our own buffer
    out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    out.index_add_(0, token_of_pair, weighted)
    return out.to(hidden.dtype)

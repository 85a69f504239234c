"""LoRA on the experts and the router, applied inside the grouped expert path.

A step's tokens may use different adapters (one *slot* each, -1 for none). Pairs (token, k)
are sorted by (local expert, slot), so each expert's rows form one contiguous run split into
one segment per adapter; the expert's GEMM runs once over the whole run and each adapter
segment adds its shrink/expand (`x A_e^T B_e^T`, scale folded into B) before the activation
(gate/up) and after it (down). The router's delta is added to the routing logits per slot
before top-k, and a shared expert's (Qwen2-MoE) to its gate/up, down and gate outputs. Weights are per local expert slot: under expert parallelism each rank holds
only its experts' slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loraplex.moe.experts_torch import (
    ExpertWeights,
    check_expert_weights,
    expert_mm,
    weighted_pair_sum,
)


@dataclass(frozen=True)
class ExpertLoraWeights:
    """One adapter's LoRA on one MoE block: per local expert slot, and the router."""

    w13_a: torch.Tensor | None  # [L, r, H]
    w13_b: torch.Tensor | None  # [L, 2I, r] (scaled)
    w2_a: torch.Tensor | None  # [L, r, I]
    w2_b: torch.Tensor | None  # [L, H, r] (scaled)
    router_a: torch.Tensor | None = None  # [r, H]
    router_b: torch.Tensor | None = None  # [E, r] (scaled)
    shared13_a: torch.Tensor | None = None  # [r, H] the shared expert's gate/up
    shared13_b: torch.Tensor | None = None  # [2S, r] (scaled)
    shared2_a: torch.Tensor | None = None  # [r, S] its down
    shared2_b: torch.Tensor | None = None  # [H, r] (scaled)
    shared_gate_a: torch.Tensor | None = None  # [r, H] its sigmoid gate
    shared_gate_b: torch.Tensor | None = None  # [1, r] (scaled)


@dataclass(frozen=True)
class ExpertLoraBatch:
    """One step's expert LoRA for one block: each token's slot and each slot's weights."""

    token_slot: torch.Tensor  # [T] int64, -1 = no adapter
    slots: list[ExpertLoraWeights | None]

    def rows(self, start: int, end: int) -> ExpertLoraBatch:
        """The batch restricted to tokens [start, end) (an expert-parallel rank's share)."""
        return ExpertLoraBatch(self.token_slot[start:end], self.slots)


def add_token_lora(
    y: torch.Tensor, x: torch.Tensor, lora: ExpertLoraBatch, part: str
) -> torch.Tensor:
    """y [T, N] plus each token's adapter's `part` delta (`x A^T B^T`), in y's dtype: the
    router (`router`) or the shared expert (`shared13`, `shared2`, `shared_gate`)."""
    for slot, w in enumerate(lora.slots):
        a = None if w is None else getattr(w, f"{part}_a")
        if a is None:
            continue
        idx = torch.nonzero(lora.token_slot == slot).squeeze(1)
        if idx.numel():
            delta = F.linear(F.linear(x[idx].to(a.dtype), a), getattr(w, f"{part}_b"))
            y.index_add_(0, idx, delta.to(y.dtype))
    return y


def add_router_lora(logits: torch.Tensor, x: torch.Tensor, lora: ExpertLoraBatch) -> torch.Tensor:
    """Routing logits [T, E] plus each token's adapter's router delta (in logits' dtype)."""
    return add_token_lora(logits, x, lora, "router")


def _segment_delta(
    y: torch.Tensor,
    x: torch.Tensor,
    runs: list[int],
    slots: list[ExpertLoraWeights | None],
    part: str,
    expert: int,
) -> None:
    """y[seg] += x[seg] A_e^T B_e^T for each adapter segment of one expert's run."""
    off = runs[0]  # rows with no adapter come first
    for slot, count in enumerate(runs[1:]):
        w = slots[slot]
        a = None if w is None else getattr(w, f"{part}_a")
        if count and a is not None:
            b = getattr(w, f"{part}_b")
            shrink = torch.mm(x[off : off + count], a[expert].t())
            y[off : off + count].addmm_(shrink, b[expert].t())
        off += count


def run_sorted_rows_lora(
    rows: torch.Tensor,
    runs: list[list[int]],
    w13: ExpertWeights,
    w2: ExpertWeights,
    slots: list[ExpertLoraWeights | None],
) -> torch.Tensor:
    """Expert MLP plus adapter deltas over rows grouped by local expert, then by slot:
    `runs[e]` = [rows with no adapter, rows of slot 0, slot 1, ...] for expert e."""
    out = rows.new_zeros(rows.shape)
    half = w2.shape[2]
    start = 0
    for expert, expert_runs in enumerate(runs):
        count = sum(expert_runs)
        if not count:
            continue
        seg = rows[start : start + count]
        gate_up = expert_mm(seg, w13, expert)
        _segment_delta(gate_up, seg, expert_runs, slots, "w13", expert)
        act = F.silu(gate_up[:, :half]) * gate_up[:, half:]
        down = expert_mm(act, w2, expert)
        _segment_delta(down, act, expert_runs, slots, "w2", expert)
        out[start : start + count] = down
        start += count
    return out


def _sorted_by_expert_and_slot(
    local: torch.Tensor, row_slot: torch.Tensor, num_local: int, num_slots: int
) -> tuple[torch.Tensor, list[list[int]]]:
    """Order of rows by (local expert, slot) and the run lengths; experts < 0 go last."""
    experts = torch.where(local < 0, num_local, local)
    key = experts * (num_slots + 1) + (row_slot + 1)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=(num_local + 1) * (num_slots + 1))
    if counts.numel() > (num_local + 1) * (num_slots + 1):
        raise ValueError(f"expert id or adapter slot out of range ({num_local} local experts)")
    runs = counts.view(num_local + 1, num_slots + 1)[:num_local].tolist()
    return order, runs


def fused_experts_lora_torch(
    hidden: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    lora: ExpertLoraBatch,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fused_experts_torch` with each token's adapter applied inside its experts' GEMMs."""
    check_expert_weights(hidden, w13, w2)
    if lora.token_slot.shape[0] != hidden.shape[0]:
        raise ValueError("expert LoRA token slots and hidden states disagree on the tokens")
    top_k = topk_ids.shape[1]
    local = (topk_ids if expert_map is None else expert_map[topk_ids]).reshape(-1)
    pair_slot = lora.token_slot.unsqueeze(1).expand(-1, top_k).reshape(-1)
    order, runs = _sorted_by_expert_and_slot(local, pair_slot, w13.shape[0], len(lora.slots))
    token_of_pair = order // top_k
    out_sorted = run_sorted_rows_lora(hidden[token_of_pair], runs, w13, w2, lora.slots)
    return weighted_pair_sum(out_sorted, order, topk_weights)


def expert_rows_lora_torch(
    rows: torch.Tensor,
    local_ids: torch.Tensor,
    row_slot: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    slots: list[ExpertLoraWeights | None],
) -> torch.Tensor:
    """Unweighted expert output per row with its adapter (the expert-parallel receive side)."""
    check_expert_weights(rows, w13, w2)
    if rows.shape[0] == 0:
        return rows.new_zeros(rows.shape)
    order, runs = _sorted_by_expert_and_slot(local_ids, row_slot, w13.shape[0], len(slots))
    out_sorted = run_sorted_rows_lora(rows[order], runs, w13, w2, slots)
    out = torch.empty_like(out_sorted)
    out[order] = out_sorted
    return out

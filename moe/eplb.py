"""EPLB-style expert load balancing: replicate hot experts, pack copies onto ranks evenly.

From measured per-expert load: every expert gets one copy, each redundant slot goes to the
expert with the highest load per copy (greedy), then the copies (each carrying its
expert's load / copies) are packed heaviest-first onto the least-loaded rank with a free
slot, never two copies of one expert on the same rank. Balancedness = mean / max tokens
per rank (1.0 is perfect).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraplex.moe.placement import ExpertPlacement


def replicate_hot_experts(load: torch.Tensor, num_physical: int, max_copies: int) -> list[int]:
    """Copies per expert: one each, then greedily one more to argmax(load / copies)."""
    num_experts = load.numel()
    if num_physical < num_experts:
        raise ValueError(f"{num_physical} physical slots cannot hold {num_experts} experts")
    copies = torch.ones(num_experts, dtype=torch.float64)
    per_copy = load.to(torch.float64).clone()
    for _ in range(num_physical - num_experts):
        per_copy_masked = torch.where(copies < max_copies, per_copy, float("-inf"))
        e = int(torch.argmax(per_copy_masked))
        if per_copy_masked[e] == float("-inf"):
            raise ValueError("more physical slots than experts x ranks can fill")
        copies[e] += 1
        per_copy[e] = load[e] / copies[e]
    return [int(c) for c in copies]


def pack_onto_ranks(
    load: torch.Tensor, copies: Sequence[int], world_size: int
) -> tuple[tuple[int, ...], ...]:
    """Greedy balanced packing of expert copies onto ranks with equal slot counts."""
    total = sum(copies)
    if total % world_size:
        raise ValueError(f"{total} physical experts do not split over {world_size} ranks")
    slots = total // world_size
    items = []
    for e, c in enumerate(copies):
        items.extend([(float(load[e]) / c, e)] * c)
    items.sort(key=lambda item: (-item[0], item[1]))
    rank_load = [0.0] * world_size
    rank_items: list[list[int]] = [[] for _ in range(world_size)]
    for weight, e in items:
        free = [r for r in range(world_size) if len(rank_items[r]) < slots]
        fresh = [r for r in free if e not in rank_items[r]] or free
        r = min(fresh, key=lambda r: (rank_load[r], len(rank_items[r]), r))
        if e in rank_items[r]:
            raise ValueError(f"cannot place the copies of expert {e} on distinct ranks")
        rank_items[r].append(e)
        rank_load[r] += weight
    return tuple(tuple(sorted(items)) for items in rank_items)


def rebalance(load: torch.Tensor, world_size: int, num_redundant: int = 0) -> ExpertPlacement:
    """A new placement for one layer from its per-expert load ([E] counts)."""
    num_experts = load.numel()
    num_physical = num_experts + num_redundant
    copies = replicate_hot_experts(load, num_physical, max_copies=world_size)
    return ExpertPlacement(num_experts, pack_onto_ranks(load, copies, world_size))


def rank_loads(placement: ExpertPlacement, load: torch.Tensor) -> torch.Tensor:
    """Expected tokens per rank: each expert's load split evenly over its copies. [W] float."""
    copies = placement.replica_counts()
    out = torch.zeros(placement.world_size, dtype=torch.float64)
    for r, experts in enumerate(placement.rank_experts):
        for e in experts:
            out[r] += float(load[e]) / copies[e]
    return out


def balancedness(per_rank: torch.Tensor) -> float:
    """mean / max of tokens per rank; 1.0 when perfectly balanced (and when idle)."""
    per_rank = per_rank.to(torch.float64)
    peak = float(per_rank.max())
    return 1.0 if peak == 0 else float(per_rank.mean()) / peak

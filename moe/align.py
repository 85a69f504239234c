"""Token-expert alignment: group the (token, k) pairs by expert for a grouped GEMM.

The kernel walks the pairs in blocks of `block_m` rows, each block belonging to one
expert. So the pairs are sorted by expert, each expert's run is padded up to a multiple
of `block_m` with a sentinel, and every block gets the expert it belongs to (-1 when that
expert lives on another expert-parallel rank, so the kernel writes zeros there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AlignedPairs:
    """Pairs sorted by expert and padded per expert to the kernel block size."""

    sorted_pair_ids: torch.Tensor  # [P] int64: flat pair index token*k + j; padding = num_pairs
    block_expert_ids: torch.Tensor  # [P // block_m] int64: local expert per block, -1 = not here
    num_pairs: int  # T * k; also the padding sentinel
    block_m: int

    @property
    def num_padded(self) -> int:
        """P: the number of (padded) rows the kernel walks."""
        return int(self.sorted_pair_ids.numel())


@dataclass(frozen=True)
class SortedPairs:
    """Pairs sorted by expert (no padding): the CPU path's view of the same grouping."""

    order: torch.Tensor  # [T*k] int64: flat pair ids, grouped by expert ascending
    counts: list[int]  # [E] pairs per expert, host-side


def sort_pairs_by_expert(topk_ids: torch.Tensor, num_experts: int) -> SortedPairs:
    """Stable-sort the flat (token, k) pairs by expert id and count each expert's run."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    if counts.numel() > num_experts:
        raise ValueError(f"expert id {int(flat.max())} out of range for {num_experts} experts")
    return SortedPairs(order=order, counts=counts.tolist())


def align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    expert_map: torch.Tensor | None = None,
) -> AlignedPairs:
    """Sort pairs by expert, pad each expert's run to `block_m`, tag each block with its expert.

    `expert_map` ([num_experts] int64) maps a global expert id to this rank's local index,
    -1 for experts held elsewhere; without it every expert is local. Output sizes depend
    only on the shapes (the worst case: every expert's run padded), and nothing is read
    back to the host, so the GPU path can be captured in a CUDA graph; blocks past the
    last used one carry expert -1 and only padding.
    """
    if block_m < 1:
        raise ValueError(f"block_m must be >= 1, got {block_m}")
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    max_padded = -(-(num_pairs + num_experts * (block_m - 1)) // block_m) * block_m
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync on CUDA
    padded = (counts + block_m - 1) // block_m * block_m
    padded_start = torch.cumsum(padded, 0) - padded
    run_start = torch.cumsum(counts, 0) - counts
    sorted_experts = flat[order]
    rank_in_run = torch.arange(num_pairs, device=device) - run_start[sorted_experts]
    positions = padded_start[sorted_experts] + rank_in_run
    sorted_pair_ids = torch.full((max_padded,), num_pairs, dtype=torch.int64, device=device)
    sorted_pair_ids[positions] = order
    block_ends = torch.cumsum(padded // block_m, 0)
    blocks = torch.arange(max_padded // block_m, device=device)
    block_experts = torch.searchsorted(block_ends, blocks, right=True)
    used = block_experts < num_experts
    if expert_map is not None:
        if expert_map.numel() != num_experts:
            raise ValueError(f"expert_map has {expert_map.numel()} entries, want {num_experts}")
        local = expert_map.to(device=device, dtype=torch.int64)
        block_experts = local[block_experts.clamp(max=num_experts - 1)]
    block_experts = torch.where(used, block_experts, torch.full_like(block_experts, -1))
    return AlignedPairs(
        sorted_pair_ids=sorted_pair_ids,
        block_expert_ids=block_experts,
        num_pairs=num_pairs,
        block_m=block_m,
    )

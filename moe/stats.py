"""Per-layer expert load, counted while serving: the input to EPLB rebalancing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from loraplex.moe.expert_parallel import ExpertParallelGroup


class ExpertLoadRecorder:
    """Counts routed (token, k) pairs per (MoE layer, logical expert).

    Each MoE block calls `record` with the expert ids it routed this step. Under expert
    parallelism each rank records its own token shard; `global_counts` sums over ranks.
    """

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.int64)

    def record(self, layer_idx: int, topk_ids: torch.Tensor) -> None:
        """Add this step's routed pairs of one layer."""
        if not 0 <= layer_idx < self.num_layers:
            raise ValueError(f"layer {layer_idx} outside 0..{self.num_layers - 1}")
        flat = topk_ids.reshape(-1).to(torch.int64)
        if self.counts.device != flat.device:  # count where routing runs: no host sync
            self.counts = self.counts.to(flat.device)
        self.counts[layer_idx].scatter_add_(0, flat, torch.ones_like(flat))

    def reset(self) -> None:
        """Start a new counting window (after a rebalance)."""
        self.counts.zero_()

    def global_counts(self, ep: ExpertParallelGroup | None = None) -> torch.Tensor:
        """The counts summed over expert-parallel ranks (a copy; collective when `ep` is set)."""
        counts = self.counts.clone()
        if ep is not None:
            ep.all_reduce_sum(counts)
        return counts.cpu()

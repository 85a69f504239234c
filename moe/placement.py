"""Expert placement: which logical experts each expert-parallel rank holds, in which slot.

A logical expert may have several physical copies (replicas of hot experts, EPLB). A
(token, k) pair for expert e goes to one replica, picked by the pair's index modulo the
replica count, so a hot expert's pairs spread over its copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class ExpertPlacement:
    """Per rank, the logical expert held in each local slot (`rank_experts[r][slot]`)."""

    num_experts: int
    rank_experts: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        held = {e for experts in self.rank_experts for e in experts}
        if held != set(range(self.num_experts)):
            missing = sorted(set(range(self.num_experts)) - held)
            extra = sorted(held - set(range(self.num_experts)))
            raise ValueError(f"placement misses experts {missing} / names unknown {extra}")
        for rank, experts in enumerate(self.rank_experts):
            if len(set(experts)) != len(experts):
                raise ValueError(f"rank {rank} holds an expert twice: {experts}")

    @classmethod
    def contiguous(cls, num_experts: int, world_size: int) -> ExpertPlacement:
        """The default: experts split into `world_size` contiguous runs (sizes differ by <= 1)."""
        if world_size < 1 or world_size > num_experts:
            raise ValueError(f"cannot place {num_experts} experts on {world_size} ranks")
        bounds = [num_experts * r // world_size for r in range(world_size + 1)]
        return cls(
            num_experts,
            tuple(tuple(range(bounds[r], bounds[r + 1])) for r in range(world_size)),
        )

    @property
    def world_size(self) -> int:
        """Number of expert-parallel ranks."""
        return len(self.rank_experts)

    @property
    def num_physical(self) -> int:
        """Physical expert copies over all ranks."""
        return sum(len(experts) for experts in self.rank_experts)

    def local_experts(self, rank: int) -> tuple[int, ...]:
        """The logical expert in each of `rank`'s local slots."""
        return self.rank_experts[rank]

    def slots_of(self, rank: int) -> dict[int, int]:
        """Logical expert -> local slot on `rank` (experts `rank` holds)."""
        return {e: slot for slot, e in enumerate(self.rank_experts[rank])}

    def replica_counts(self) -> list[int]:
        """Number of physical copies of each logical expert."""
        counts = [0] * self.num_experts
        for experts in self.rank_experts:
            for e in experts:
                counts[e] += 1
        return counts

    @cached_property
    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        counts = self.replica_counts()
        width = max(counts)
        rep_rank = torch.zeros(self.num_experts, width, dtype=torch.int64)
        rep_slot = torch.zeros(self.num_experts, width, dtype=torch.int64)
        filled = [0] * self.num_experts
        for rank, experts in enumerate(self.rank_experts):
            for slot, e in enumerate(experts):
                rep_rank[e, filled[e]] = rank
                rep_slot[e, filled[e]] = slot
                filled[e] += 1
        return torch.tensor(counts, dtype=torch.int64), rep_rank, rep_slot

    def route_pairs(
        self, topk_ids: torch.Tensor, pair_offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(destination rank, destination slot) of every flat (token, k) pair: two [T*k] tensors.

        The replica of a pair is `(pair_offset + pair index) % replicas`, so copies share load.
        """
        counts, rep_rank, rep_slot = (t.to(topk_ids.device) for t in self._tables)
        flat = topk_ids.reshape(-1)
        pair_index = torch.arange(flat.numel(), device=flat.device) + pair_offset
        replica = pair_index % counts[flat]
        return rep_rank[flat, replica], rep_slot[flat, replica]

    def pairs_per_rank(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """How many (token, k) pairs each rank would compute for this routing: [W] int64."""
        ranks, _ = self.route_pairs(topk_ids)
        return torch.bincount(ranks, minlength=self.world_size)

    def expert_map(self, rank: int) -> torch.Tensor:
        """[E] int64: global expert -> first local slot on `rank`, -1 if `rank` lacks it."""
        table = torch.full((self.num_experts,), -1, dtype=torch.int64)
        for e, slot in self.slots_of(rank).items():
            table[e] = slot
        return table

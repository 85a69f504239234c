"""Which checkpoint tensors a rank needs: name predicates for the streaming loader's `select`.

Under expert parallelism a rank holds only some experts. Checkpoints that store one tensor per
expert (`...mlp.experts.{i}.gate_proj.weight`, Mixtral's `...block_sparse_moe.experts.{i}.w1`)
can be filtered by name, so a rank never fetches other ranks' experts. Fused 3-D expert
tensors (`...experts.gate_up_proj` [E, ...]) hold every expert in one tensor; a rank reads only
its experts' rows of them (`ExpertShare.rows`, a row slice the range planner turns into byte
spans), handed on as a [len(rows), ...] tensor holding the rank's experts in increasing order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

_EXPERT = re.compile(r"\.experts\.(\d+)\.")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_FUSED = re.compile(r"\.experts\.(?:gate_up_proj|down_proj)(?:\.weight)?$")


def expert_index(name: str) -> int | None:
    """The expert number in a per-expert tensor name, or None for any other tensor."""
    m = _EXPERT.search(name)
    return int(m.group(1)) if m else None


def expert_selector(owned_experts: Collection[int]) -> Callable[[str], bool]:
    """Keep every non-expert tensor and the per-expert tensors of `owned_experts` only."""
    owned = frozenset(owned_experts)

    def keep(name: str) -> bool:
        idx = expert_index(name)
        return idx is None or idx in owned

    return keep


def contiguous_experts(rank: int, world_size: int, num_experts: int) -> range:
    """The experts a rank holds under the plain contiguous placement (E / world_size each)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad rank {rank} of world size {world_size}")
    if num_experts % world_size:
        raise ValueError(f"{num_experts} experts do not split evenly over {world_size} ranks")
    per = num_experts // world_size
    return range(rank * per, (rank + 1) * per)


def layer_index(name: str) -> int | None:
    """The decoder layer number in a checkpoint name (`...layers.{l}...`), or None."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class ExpertShare:
    """The experts one expert-parallel rank holds in each MoE layer, and so which checkpoint
    tensors it needs: every non-expert tensor, its experts' per-expert tensors, and its
    experts' rows of fused 3-D expert tensors."""

    num_experts: int
    layer_experts: Mapping[int, frozenset[int]]

    def _held(self, name: str) -> frozenset[int] | None:
        layer = layer_index(name)
        return None if layer is None else self.layer_experts.get(layer)

    def keep(self, name: str) -> bool:
        """Whether the rank needs tensor `name` at all."""
        idx = expert_index(name)
        if idx is None:
            return True
        held = self._held(name)
        return held is None or idx in held

    def rows(self, name: str) -> tuple[int, ...] | None:
        """For a fused expert tensor: the rank's experts (increasing) when it lacks some; else None."""
        if not _FUSED.search(name):
            return None
        held = self._held(name)
        if held is None or len(held) >= self.num_experts:
            return None
        return tuple(sorted(held))

    def holds_all(self) -> bool:
        """True when the rank holds every expert of every layer (nothing to skip)."""
        return all(len(h) >= self.num_experts for h in self.layer_experts.values())

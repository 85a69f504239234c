"""Which checkpoint tensors a rank needs: name predicates for the streaming loader's `select`.

Under expert parallelism a rank holds only some experts. Checkpoints that store one tensor per
expert (`...mlp.experts.{i}.gate_proj.weight`, Mixtral's `...block_sparse_moe.experts.{i}.w1`)
can be filtered by name, so a rank never fetches other ranks' experts. Fused 3-D expert
tensors (`...experts.gate_up_proj`) hold every expert in one tensor and are kept whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

_EXPERT = re.compile(r"\.experts\.(\d+)\.")


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

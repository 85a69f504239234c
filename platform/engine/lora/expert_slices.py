"""An adapter's per-expert LoRA factors cut into rows by expert, for expert-parallel ranks.

An `ExpertLoraModule` holds one row per expert in its per-expert factors (`w13_a`, `w13_b`,
`w2_a`, `w2_b`, [E, ...]); the router's and shared expert's factors serve every rank whole.
Rank 0 sends followers an adapter `without_expert_rows` (those tensors with no rows, ranks kept)
and then each follower only `expert_rows` of the experts it holds; a follower lays them into a
host copy `with_room_for_rows` (rows it never received stay zero and are never run: the mirror
checks every local expert has its rows).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from loraplex.adapters.expert_weights import ExpertLoraModule
from loraplex.adapters.weights import LoadedAdapter

PER_EXPERT = ("w13_a", "w13_b", "w2_a", "w2_b")


@dataclass(frozen=True)
class ExpertRows:
    """Some experts' rows of one layer's per-expert factors (`tensors[name]` [len(experts), ...])."""

    experts: tuple[int, ...]
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        """Bytes of the rows."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def expert_rows(module: ExpertLoraModule, experts: list[int]) -> ExpertRows:
    """The rows of `experts` (copies: pickling them sends only these bytes)."""
    idx = torch.tensor(experts, dtype=torch.long)
    tensors = {
        n: getattr(module, n).index_select(0, idx).contiguous()
        for n in PER_EXPERT
        if getattr(module, n) is not None
    }
    return ExpertRows(tuple(experts), tensors)


def without_expert_rows(adapter: LoadedAdapter) -> LoadedAdapter:
    """`adapter` with its per-expert factors emptied to zero rows (shapes' ranks kept)."""
    if not adapter.experts:
        return adapter
    experts = {}
    for layer, module in adapter.experts.items():
        empty = {
            n: t.new_empty((0, *t.shape[1:]))
            for n in PER_EXPERT
            if (t := getattr(module, n)) is not None
        }
        experts[layer] = dataclasses.replace(module, **empty)
    return dataclasses.replace(adapter, experts=experts)


def with_room_for_rows(adapter: LoadedAdapter, num_experts: dict[int, int]) -> LoadedAdapter:
    """A host copy of an emptied adapter with zero rows for all `num_experts[layer]` experts."""
    if not adapter.experts:
        return adapter
    experts = {}
    for layer, module in adapter.experts.items():
        room = {
            n: t.new_zeros((num_experts[layer], *t.shape[1:]))
            for n in PER_EXPERT
            if (t := getattr(module, n)) is not None
        }
        experts[layer] = dataclasses.replace(module, **room)
    return dataclasses.replace(adapter, experts=experts)


def put_expert_rows(module: ExpertLoraModule, rows: ExpertRows) -> None:
    """Lay received rows into a host copy made by `with_room_for_rows` (in place)."""
    idx = torch.tensor(rows.experts, dtype=torch.long)
    for name, t in rows.tensors.items():
        getattr(module, name).index_copy_(0, idx, t)

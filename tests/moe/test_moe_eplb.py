"""EPLB rebalancing and expert placement: replicas for hot experts, balanced packing."""

from __future__ import annotations

import pytest
import torch

from loraplex.moe.eplb import (
    balancedness,
    pack_onto_ranks,
    rank_loads,
    rebalance,
    replicate_hot_experts,
)
from loraplex.moe.placement import ExpertPlacement
from loraplex.moe.stats import ExpertLoadRecorder


def test_replicas_go_to_the_hottest_experts_by_load_per_copy() -> None:
    load = torch.tensor([100.0, 10.0, 40.0, 1.0])
    # 3 extra slots: 100 -> 2 copies (50 each), then 50 > 40 -> 3 copies (33.3), then 40.
    assert replicate_hot_experts(load, 7, max_copies=4) == [3, 1, 2, 1]
    # capped at 2 copies: 100 -> 2, 40 -> 2, then 10 (expert 1) beats 1.
    assert replicate_hot_experts(load, 7, max_copies=2) == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="cannot hold"):
        replicate_hot_experts(load, 3, max_copies=4)


def test_packing_balances_ranks_and_never_doubles_an_expert() -> None:
    load = torch.tensor([100.0, 10.0, 40.0, 1.0, 30.0, 30.0])
    copies = [2, 1, 1, 1, 2, 1]
    ranks = pack_onto_ranks(load, copies, world_size=4)
    assert all(len(r) == 2 for r in ranks)
    assert all(len(set(r)) == len(r) for r in ranks)
    placement = ExpertPlacement(6, ranks)
    assert placement.replica_counts() == copies
    per_rank = rank_loads(placement, load)
    assert per_rank.sum() == pytest.approx(float(load.sum()))
    assert balancedness(per_rank) > 0.8


def test_rebalance_improves_a_skewed_load() -> None:
    g = torch.Generator().manual_seed(0)
    load = (torch.rand(32, generator=g) ** 6 * 1000).round()
    before = balancedness(rank_loads(ExpertPlacement.contiguous(32, 4), load))
    placement = rebalance(load, world_size=4, num_redundant=4)
    after = balancedness(rank_loads(placement, load))
    assert placement.num_physical == 36
    assert after > before and after > 0.9


def test_measured_pairs_per_rank_split_over_replicas() -> None:
    placement = ExpertPlacement(4, ((0, 1), (0, 2), (3,)))
    ids = torch.zeros(10, 1, dtype=torch.int64)  # all pairs to expert 0 (on ranks 0 and 1)
    assert placement.pairs_per_rank(ids).tolist() == [5, 5, 0]
    ranks, slots = placement.route_pairs(torch.tensor([[2, 3]]))
    assert ranks.tolist() == [1, 2] and slots.tolist() == [1, 0]
    assert placement.expert_map(1).tolist() == [0, -1, 1, -1]


def test_placement_validation() -> None:
    with pytest.raises(ValueError, match="misses experts"):
        ExpertPlacement(3, ((0,), (1,)))
    with pytest.raises(ValueError, match="twice"):
        ExpertPlacement(2, ((0, 0), (1,)))
    with pytest.raises(ValueError, match="cannot place"):
        ExpertPlacement.contiguous(2, 3)
    assert ExpertPlacement.contiguous(5, 2).rank_experts == ((0, 1), (2, 3, 4))


def test_balancedness_edge_cases() -> None:
    assert balancedness(torch.zeros(4)) == 1.0
    assert balancedness(torch.tensor([1.0, 1.0])) == 1.0
    assert balancedness(torch.tensor([3.0, 1.0])) == pytest.approx(0.5 * 4 / 3)


def test_load_recorder_counts_per_layer() -> None:
    rec = ExpertLoadRecorder(num_layers=2, num_experts=3)
    rec.record(1, torch.tensor([[0, 2], [2, 1]]))
    rec.record(1, torch.tensor([[2, 0]]))
    assert rec.counts.tolist() == [[0, 0, 0], [2, 1, 3]]
    with pytest.raises(ValueError, match="layer"):
        rec.record(2, torch.tensor([[0]]))
    rec.reset()
    assert int(rec.counts.sum()) == 0

"""A MoE block loads fused 3-D expert tensors whole ([E, ...]) or as just its experts' rows
([held, ...], increasing expert order, what the loader hands an expert-parallel rank)."""

from __future__ import annotations

import pytest
import torch

from loraplex.moe.gating import GatingConfig
from loraplex.moe.layer import MoEBlock
from loraplex.moe.placement import ExpertPlacement
from loraplex.moe.spec import MoESpec

SPEC = MoESpec(hidden_size=4, intermediate_size=3, num_experts=6, gating=GatingConfig(top_k=2))


def _block(rank_experts) -> MoEBlock:
    return MoEBlock(SPEC, placement=ExpertPlacement(6, rank_experts))  # rank 0's share


def test_whole_and_row_sliced_fused_tensors_load_the_same() -> None:
    gen = torch.Generator().manual_seed(0)
    gate_up = torch.randn(6, 6, 4, generator=gen)
    down = torch.randn(6, 4, 3, generator=gen)
    held = ((5, 1, 3), (0, 2, 4))  # rank 0's slots hold experts 5, 1, 3 (not sorted)
    whole, rows = _block(held), _block(held)
    whole.load_weight("experts.gate_up_proj", gate_up)
    whole.load_weight("experts.down_proj", down)
    rows.load_weight("experts.gate_up_proj", gate_up[[1, 3, 5]])
    rows.load_weight("experts.down_proj", down[[1, 3, 5]])
    for b in (whole, rows):
        assert torch.equal(b.w13, gate_up[[5, 1, 3]]) and torch.equal(b.w2, down[[5, 1, 3]])
        assert "w13" not in b.missing_weights and "w2" not in b.missing_weights


def test_fused_tensor_with_wrong_row_count_is_refused() -> None:
    block = _block(((0, 1), (2, 3, 4, 5)))
    with pytest.raises(ValueError, match=r"expected \(2, 6, 4\)"):
        block.load_weight("experts.gate_up_proj", torch.zeros(3, 6, 4))

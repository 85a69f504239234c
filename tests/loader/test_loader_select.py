"""Expert-parallel tensor selection by name."""

from __future__ import annotations

import pytest

from loraplex.loader.select import contiguous_experts, expert_index, expert_selector


def test_expert_names_and_selection() -> None:
    assert expert_index("model.layers.3.mlp.experts.17.down_proj.weight") == 17
    assert expert_index("model.layers.3.block_sparse_moe.experts.0.w1.weight") == 0
    assert expert_index("model.layers.3.mlp.experts.gate_up_proj") is None
    assert expert_index("model.layers.3.mlp.shared_expert.up_proj.weight") is None
    keep = expert_selector({2, 3})
    assert keep("model.layers.0.mlp.experts.2.up_proj.weight")
    assert not keep("model.layers.0.mlp.experts.12.up_proj.weight")
    assert keep("model.layers.0.mlp.gate.weight")


def test_contiguous_placement() -> None:
    assert list(contiguous_experts(0, 4, 8)) == [0, 1]
    assert list(contiguous_experts(3, 4, 8)) == [6, 7]
    with pytest.raises(ValueError, match="evenly"):
        contiguous_experts(0, 3, 8)
    with pytest.raises(ValueError, match="bad rank"):
        contiguous_experts(4, 4, 8)

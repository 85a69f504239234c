"""The AWQ / GPTQ reader's refusals: act-order groups of unequal size, a g_idx that permutes
groups under desc_act false, packed weights of a module served unquantized. (Its reading of real
checkpoints is checked against AutoAWQ / AutoGPTQ in tests/platform/engine/quant.)"""

from __future__ import annotations

import pytest
import torch

from loraplex.loader.quant.awq_gptq import AwqGptqReader, act_order_permutation
from loraplex.loader.quant.schemes import QuantScheme

GPTQ = QuantScheme("gptq", "int4", None, 128, symmetric=False)
P = "model.layers.0.mlp.down_proj."


def _gptq_parts(inp: int = 256, out: int = 16) -> dict[str, torch.Tensor]:
    return {
        "qweight": torch.zeros(inp // 8, out, dtype=torch.int32),
        "qzeros": torch.full((inp // 128, out // 8), 0x77777777, dtype=torch.int32),
        "scales": torch.ones(inp // 128, out, dtype=torch.float16),
    }


def test_act_order_needs_groups_of_the_group_size() -> None:
    g = torch.arange(256) // 128
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(0))
    assert torch.equal(g[perm][act_order_permutation(g[perm], 128)], g)
    with pytest.raises(NotImplementedError, match="unequal size"):
        act_order_permutation(torch.cat([torch.zeros(100), torch.ones(156)]).int(), 128)


def test_a_permuting_g_idx_without_desc_act_is_refused() -> None:
    reader = AwqGptqReader(GPTQ, {P: 256})
    g_idx = (torch.arange(256) // 128).flip(0).int()
    out = [x for piece, t in _gptq_parts().items() for x in reader.apply(P + piece, t)]
    assert len(out) == 3  # complete without g_idx (optional under desc_act false)
    assert reader.apply(P + "g_idx", (torch.arange(256) // 128).int()) == []  # late, trivial
    with pytest.raises(ValueError, match="permutes the groups but the checkpoint says desc_act"):
        reader.apply(P + "g_idx", g_idx)


def test_sym_zero_points_read_as_eight_and_codes_come_out_as_canonical() -> None:
    reader = AwqGptqReader(GPTQ, {P: 256})
    out = []
    for piece, t in _gptq_parts().items():
        out += reader.apply(P + piece, t)
    got = dict(out)
    assert got[P + "weight"].shape == (16, 256) and got[P + "weight"].dtype == torch.uint8
    assert torch.equal(got[P + "weight_zero"], torch.full((16, 2), 8.0))  # stored 7 = z - 1


def test_packed_weights_of_an_unquantized_module_are_refused() -> None:
    reader = AwqGptqReader(GPTQ, {P: 256})
    assert reader.apply("model.norm.weight", torch.ones(4))[0][0] == "model.norm.weight"
    with pytest.raises(NotImplementedError, match="not serve quantized"):
        reader.apply("model.layers.0.mlp.experts.0.down_proj.qweight", torch.zeros(4, 4).int())

"""bf16 CPU weights packed for oneDNN once loaded: same outputs as the plain matmul."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.platform.engine.layers.linear import MergedLinear
from loraplex.platform.engine.layers.onednn_weights import (
    can_pack,
    is_packed,
    onednn_bf16_available,
    pack_weight,
    packed_linear,
)
from loraplex.platform.engine.models.decoder import LMHead

pytestmark = pytest.mark.skipif(
    not onednn_bf16_available(), reason="this CPU has no native bf16 for oneDNN"
)


def test_a_loaded_bf16_linear_is_packed_and_matches_f_linear():
    layer = MergedLinear(64, [48, 16], ["gate_proj", "up_proj"], bias=True, layer_idx=0,
                         dtype=torch.bfloat16)  # fmt: skip
    w = torch.randn(64, 64).bfloat16()
    b = torch.randn(64).bfloat16()
    layer.load_slice("gate_proj", w[:48])
    layer.load_slice("up_proj", w[48:])
    layer.load_slice("gate_proj", b[:48], is_bias=True)
    layer.load_slice("up_proj", b[48:], is_bias=True)
    layer.finish_loading()
    assert is_packed(layer.weight) and tuple(layer.weight.shape) == (64, 64)
    assert torch.equal(layer.weight.to_dense(), w)
    for rows in (1, 7, 64, 300):
        x = torch.randn(rows, 64).bfloat16()
        torch.testing.assert_close(layer(x), F.linear(x, w, b), atol=1e-2, rtol=1e-2)


def test_fp32_and_tied_heads_stay_plain():
    layer = MergedLinear(8, [8], ["o_proj"], bias=False, layer_idx=0, dtype=torch.float32)
    layer.finish_loading()
    assert not is_packed(layer.weight) and not can_pack(layer.weight)
    with pytest.raises(ValueError, match="cannot pack"):
        pack_weight(torch.randn(4, 4))
    head = LMHead(100, 16, torch.bfloat16)
    with torch.no_grad():
        head.weight.normal_()
    head.finish_loading(tied=True)
    assert not is_packed(head.weight)
    dense = head.weight.detach().clone()
    head.finish_loading(tied=False)
    assert is_packed(head.weight)
    x = torch.randn(5, 16).bfloat16()
    torch.testing.assert_close(head(x), F.linear(x, dense), atol=1e-2, rtol=1e-2)
    assert packed_linear(x, head.weight).shape == (5, 100)

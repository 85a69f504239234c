"""The int4 method's act-order input order (GPTQ desc_act): a layer whose weight columns are
stored in `input_perm` order computes x @ W^T on both the packed CPU kernel and the
dequantizing path; an identity order is dropped at load; fused slices must share one order."""

from __future__ import annotations

import pytest
import torch

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.loader.quant.weight_only import dequantize_int4
from loraplex.platform.engine.layers.linear import Linear, MergedLinear
from loraplex.platform.engine.layers.quant import linear_quantization

ACT_ORDER = QuantScheme("gptq", "int4", None, 128, symmetric=False, act_order=True)
GEN = torch.Generator().manual_seed(0)


def _stored(out: int, inp: int) -> dict[str, torch.Tensor]:
    """Codes / scales / zeros in stored (grouped) column order and a random input order."""
    return {
        "weight": torch.randint(0, 16, (out, inp), generator=GEN, dtype=torch.uint8),
        "weight_scale": torch.rand(out, inp // 128, generator=GEN) * 0.02 + 0.005,
        "weight_zero": torch.randint(0, 16, (out, inp // 128), generator=GEN).float(),
        "input_perm": torch.randperm(inp, generator=GEN),
    }


def _layer(parts: dict[str, torch.Tensor]) -> Linear:
    out, inp = parts["weight"].shape
    with linear_quantization(ACT_ORDER):
        layer = Linear(inp, out, bias=False, layer_idx=0, name="o_proj", dtype=torch.float32)
    for piece, t in parts.items():
        layer.load_slice("o_proj", t, piece=piece)
    layer.finish_loading()
    return layer


@pytest.mark.parametrize("out", [32, 24])  # 24: off the CPU packer's grid (dequantizing path)
def test_the_input_order_is_applied_to_the_activations(out: int) -> None:
    parts = _stored(out, 256)
    layer = _layer(parts)
    assert (layer.quant_kernel == "cpu_int4pack") == (out % 16 == 0)
    assert layer.input_perm is not None
    stored = dequantize_int4(parts["weight"], parts["weight_scale"], parts["weight_zero"],
                             torch.float32)  # fmt: skip
    w = torch.empty_like(stored)
    w[:, parts["input_perm"]] = stored  # stored column j is input input_perm[j]
    x = torch.randn(5, 256, generator=GEN)
    want = x @ w.T
    torch.testing.assert_close(layer(x), want, atol=1e-4 * want.abs().max(), rtol=0)
    assert (x @ stored.T - want).abs().max() > 100 * 1e-4 * want.abs().max()  # order matters


def test_an_identity_order_is_dropped_at_load() -> None:
    parts = _stored(32, 256)
    parts["input_perm"] = torch.arange(256)
    assert _layer(parts).input_perm is None


def test_fused_slices_must_share_their_order() -> None:
    with linear_quantization(ACT_ORDER):
        layer = MergedLinear(256, [32, 32], ["gate_proj", "up_proj"], bias=False, layer_idx=0,
                             dtype=torch.float32)  # fmt: skip
    perm = torch.randperm(256, generator=GEN)
    layer.load_slice("gate_proj", perm, piece="input_perm")
    layer.load_slice("up_proj", perm.clone(), piece="input_perm")  # the same order: fine
    with pytest.raises(ValueError, match="fused layer serves one input order"):
        layer.load_slice("up_proj", perm.flip(0), piece="input_perm")

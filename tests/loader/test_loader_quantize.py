"""Quantization on the way in: casts, int8 / int4 / fp8 with their dequant, refusals."""

from __future__ import annotations

import pytest
import torch

from loraplex.loader.quant import Quantizer, parse_quantization
from loraplex.loader.quant.weight_only import dequantize_int8, quantize_int8_per_channel


def test_choices_are_parsed_and_unknown_ones_refused() -> None:
    assert parse_quantization(None) == "none"
    assert parse_quantization("BF16") == "bf16"
    assert parse_quantization("w8a16") == "int8"
    assert parse_quantization("W4A16") == "int4"
    assert parse_quantization("int4_sym") == "int4_sym"
    assert parse_quantization("fp8_e4m3") == "fp8"
    with pytest.raises(ValueError, match="unknown weight quantization 'q3'"):
        parse_quantization("q3")
    with pytest.raises(NotImplementedError, match="not implemented"):
        Quantizer("fp8_e5m2")
    for choice in ("awq", "gptq"):  # named formats of pre-quantized checkpoints, never made here
        assert parse_quantization(choice.upper()) == choice
        with pytest.raises(ValueError, match="use int4"):
            Quantizer(choice)


@pytest.mark.parametrize(
    ("choice", "dtype"),
    [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)],
)
def test_casts_touch_only_floating_tensors(choice: str, dtype: torch.dtype) -> None:
    q = Quantizer(choice)
    w = torch.randn(4, 3, dtype=torch.float32 if dtype != torch.float32 else torch.bfloat16)
    [(name, out)] = q.apply("a.weight", w)
    assert name == "a.weight" and out.dtype == dtype
    torch.testing.assert_close(out, w.to(dtype))
    ids = torch.arange(4)
    assert q.apply("ids", ids)[0][1] is ids
    f8 = torch.zeros(2, dtype=torch.float8_e4m3fn)
    assert q.apply("x", f8)[0][1].dtype == torch.float8_e4m3fn


def test_none_passes_tensors_through() -> None:
    w = torch.randn(3, 3)
    assert Quantizer("none").apply("w", w) == [("w", w)]


def test_int8_per_channel_round_trip_is_close() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 128) * torch.linspace(0.01, 4, 64)[:, None]
    q, scale = quantize_int8_per_channel(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    assert q.abs().max() <= 127
    back = dequantize_int8(q, scale, torch.float32)
    # Symmetric rounding error: at most half a step per channel.
    assert torch.all((back - w).abs() <= scale[:, None] / 2 + 1e-6)
    # A layer computed with the dequantized weight stays close to the original.
    x = torch.randn(8, 128)
    rel = (x @ back.T - x @ w.T).norm() / (x @ w.T).norm()
    assert rel < 0.01


def test_int8_zero_rows_are_safe() -> None:
    q, scale = quantize_int8_per_channel(torch.zeros(2, 4))
    assert torch.equal(q, torch.zeros(2, 4, dtype=torch.int8))
    assert torch.equal(dequantize_int8(q, scale, torch.float32), torch.zeros(2, 4))


def test_int8_quantizer_targets_linear_weights_only() -> None:
    q = Quantizer("int8")
    w = torch.randn(16, 8, dtype=torch.bfloat16)
    out = dict(q.apply("model.layers.0.self_attn.q_proj.weight", w))
    assert set(out) == {
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.weight_scale",
    }
    qw = out["model.layers.0.self_attn.q_proj.weight"]
    back = dequantize_int8(qw, out["model.layers.0.self_attn.q_proj.weight_scale"], w.dtype)
    torch.testing.assert_close(back.float(), w.float(), atol=w.float().abs().max() / 127, rtol=0)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert q.apply(name, w)[0][1] is w
    assert q.apply("model.layers.0.mlp.gate.weight", w)[0][1] is w  # MoE router stays precise
    bias = torch.randn(16)
    assert q.apply("x.bias", bias)[0][1] is bias


@pytest.mark.parametrize("choice", ["int4", "int4_sym", "fp8"])
def test_low_bit_quantizers_emit_the_canonical_layout(choice: str) -> None:
    from loraplex.loader.quant.weight_only import dequantize_fp8, dequantize_int4

    w = torch.randn(32, 256)
    out = dict(Quantizer(choice).apply("model.layers.0.mlp.down_proj.weight", w))
    p = "model.layers.0.mlp.down_proj."
    q, scale = out[p + "weight"], out[p + "weight_scale"]
    if choice == "fp8":
        assert set(out) == {p + "weight", p + "weight_scale"} and q.dtype == torch.float8_e4m3fn
        back = dequantize_fp8(q, scale, torch.float32)
        tol = 0.07 * w.abs().amax(dim=1, keepdim=True)  # 3 mantissa bits
    else:
        sym = choice == "int4_sym"
        assert (p + "weight_zero" in out) is not sym and q.dtype == torch.uint8
        assert scale.shape == (32, 2) and int(q.max()) <= 15
        zero = out.get(p + "weight_zero", torch.full_like(scale, 8.0))
        back = dequantize_int4(q, scale, zero, torch.float32)
        tol = scale.repeat_interleave(128, dim=1) * (1.0 if sym else 0.5) + 1e-6
    assert ((back - w).abs() <= tol).all()
    for name in ("model.layers.0.mlp.experts.3.up_proj.weight", "model.embed_tokens.weight"):
        assert Quantizer(choice).apply(name, w)[0][1] is w

"""Quantized Linear methods vs a dequantize-then-matmul reference: int8 (packed CPU kernel),
int4 sym/asym g128 (packed CPU kernel, and the dequantizing fallback), fp8 weight-only on CPU
and W8A8 via `torch._scaled_mm` (the fp8-GPU path, run here on PyTorch's CPU kernel); fused
slices load like float weights. (The Triton CUDA kernels: test_quant_triton_kernels.py.)"""

from __future__ import annotations

import pytest
import torch

from loraplex.loader.quant import Quantizer, resolve_scheme
from loraplex.loader.quant.weight_only import (
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    quantize_int4_grouped,
)
from loraplex.platform.engine.layers.linear import Linear, MergedLinear
from loraplex.platform.engine.layers.quant import linear_quantization
from loraplex.platform.engine.layers.quant.fp8 import fp8_codes_to, quantize_per_token

CHOICES = ["int8", "int4", "int4_sym", "fp8"]


def _quantized_linear(
    choice: str, w: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.bfloat16
) -> Linear:
    out, inp = w.shape
    with linear_quantization(resolve_scheme(choice)):
        layer = Linear(inp, out, bias=bias is not None, layer_idx=0, name="o_proj", dtype=dtype)
    for name, t in Quantizer(choice).apply("model.o_proj.weight", w):
        layer.load_slice("o_proj", t, piece=name.rsplit(".", 1)[1])
    if bias is not None:
        layer.load_slice("o_proj", bias.to(dtype), is_bias=True)
    layer.finish_loading()
    return layer


def _dequantized(choice: str, w: torch.Tensor) -> torch.Tensor:
    """The fp32 weight the quantized one stands for, from the loader's own tensors."""
    parts = {n.rsplit(".", 1)[1]: t for n, t in Quantizer(choice).apply("m.o_proj.weight", w)}
    q, s = parts["weight"], parts["weight_scale"]
    if choice == "int8":
        return dequantize_int8(q, s, torch.float32)
    if choice == "fp8":
        return dequantize_fp8(q, s, torch.float32)
    return dequantize_int4(q, s, parts.get("weight_zero", torch.full_like(s, 8.0)), torch.float32)


@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("tokens", [1, 7, 33])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 1.5e-2)])
def test_quantized_matmul_matches_dequantize_then_matmul(
    choice: str, tokens: int, dtype: torch.dtype, tol: float
) -> None:
    g = torch.Generator().manual_seed(tokens)
    w = torch.randn(96, 256, generator=g) / 16
    bias = torch.randn(96, generator=g) * 0.1
    x = torch.randn(tokens, 256, generator=g).to(dtype)
    layer = _quantized_linear(choice, w, bias, dtype)
    got = layer(x)
    assert got.dtype == dtype and got.shape == (tokens, 96)
    assert not getattr(layer, "fp8_w8a8", False)  # CPU: fp8 takes the weight-only path
    xr = x.float()
    want = xr @ _dequantized(choice, w).T + bias.to(dtype).float()
    err = (got.float() - want).abs().max() / want.abs().max()
    assert err < tol, err
    if dtype == torch.float32:  # the quantization is real: far above the kernel's error
        plain = x.float() @ w.T + bias
        assert (plain - want).abs().max() / want.abs().max() > 100 * err


@pytest.mark.parametrize("tokens", [1, 9])
def test_fp8_w8a8_scaled_mm_matches_its_reference(tokens: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    w = torch.randn(96, 256, generator=g) / 16
    x = torch.randn(tokens, 256, generator=g)
    layer = _quantized_linear("fp8", w, None, torch.float32)
    layer.fp8_w8a8 = True  # what an fp8 GPU runs; PyTorch's CPU _scaled_mm runs it here
    xq, xs = quantize_per_token(x)  # W8A8: the activations are quantized per token too
    want = (xq.float() * xs) @ _dequantized("fp8", w).T
    err = (layer(x) - want).abs().max() / want.abs().max()
    assert err < 1e-5, err
    weight_only = x @ _dequantized("fp8", w).T  # the activation rounding is real
    assert (weight_only - want).abs().max() / want.abs().max() > 100 * err


def test_weights_are_stored_in_the_kernel_layout() -> None:
    w = torch.randn(64, 256)
    int8 = _quantized_linear("int8", w, None)
    assert int8.weight.dtype == torch.int8 and int8.weight.shape == (64, 256)
    int4 = _quantized_linear("int4", w, None)
    assert int4.quant_kernel == "cpu_int4pack" and int4.weight.dtype == torch.uint8
    assert int4.weight.numel() == 64 * 256 // 2  # two codes a byte
    assert int4.weight_scale.shape == (2, 64, 2)  # [groups, out, (scale, zero)]
    fp8 = _quantized_linear("fp8", w, None)
    assert fp8.weight.dtype == torch.float8_e4m3fn and not fp8.fp8_w8a8


def test_int4_out_features_off_the_packer_grid_use_the_dequantizing_path() -> None:
    w = torch.randn(24, 128)  # the CPU int4 packer needs out % 16 == 0
    layer = _quantized_linear("int4", w, None)
    assert layer.quant_kernel == "dequant"
    x = torch.randn(5, 128).to(torch.bfloat16)
    want = x.float() @ _dequantized("int4", w).T
    torch.testing.assert_close(layer(x).float(), want, atol=2e-2 * want.abs().max(), rtol=0)


@pytest.mark.parametrize("choice", CHOICES)
def test_fused_slices_quantize_like_separate_weights(choice: str) -> None:
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(64, 128, generator=g), torch.randn(32, 128, generator=g) * 3
    with linear_quantization(resolve_scheme(choice)):
        fused = MergedLinear(128, [64, 32], ["q_proj", "k_proj"], bias=False, layer_idx=0,
                             dtype=torch.bfloat16)  # fmt: skip
    quantizer = Quantizer(choice)
    for name, w in (("q_proj", q), ("k_proj", k)):
        for full, t in quantizer.apply(f"l.{name}.weight", w):
            fused.load_slice(name, t, piece=full.rsplit(".", 1)[1])
    fused.finish_loading()
    x = torch.randn(3, 128).to(torch.bfloat16)
    y = fused(x).float()
    for w, rows in ((q, slice(0, 64)), (k, slice(64, 96))):
        alone = _quantized_linear(choice, w, None)(x).float()
        torch.testing.assert_close(y[:, rows], alone, atol=1e-2 * alone.abs().max(), rtol=0)


def test_a_slice_of_the_wrong_shape_is_refused() -> None:
    with linear_quantization(resolve_scheme("int4")):
        layer = Linear(128, 32, bias=False, layer_idx=0, name="o_proj", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight_scale"):
        layer.load_slice("o_proj", torch.zeros(32, 2), piece="weight_scale")
    with (
        pytest.raises(ValueError, match="divisible by the group size"),
        linear_quantization(resolve_scheme("int4")),
    ):
        Linear(96, 32, bias=False, layer_idx=0, name="o_proj", dtype=torch.bfloat16)


def test_int4_grouped_round_trip_is_within_half_a_step() -> None:
    w = torch.randn(16, 256)
    for symmetric in (True, False):
        q, s, z = quantize_int4_grouped(w, 128, symmetric=symmetric)
        assert int(q.max()) <= 15
        err = (dequantize_int4(q, s, z, torch.float32) - w).abs().view(16, 2, 128)
        assert (err <= s[..., None] * 0.5 + 1e-6).all() or symmetric  # sym clips the top code
        assert (err <= s[..., None] + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_codes_convert_exactly_by_bit_arithmetic(dtype: torch.dtype) -> None:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = ~torch.isnan(codes.float())  # 0x7F and 0xFF are e4m3's NaNs, never a weight
    got = fp8_codes_to(codes, dtype)
    assert got.dtype == dtype
    assert torch.equal(got[finite].float(), codes.float()[finite])
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(codes.float()[finite]))

"""Cases for the Triton W8A16 / W4A16 GEMMs under TRITON_INTERPRET=1 against the torch reference
(the dequantize-then-matmul of `loader.quant.weight_only`).

Run by test_quant_triton_kernels.py in a fresh interpreter with TRITON_INTERPRET=1 (Triton reads
it when the kernels are defined, and other tests import them first). Odd M (1, 3, 17), K a
multiple of 128 (int8 also off the K tile), N off the column tile, int4 sym and asym, fp32 /
fp16 / bf16 activations, the stride contract, and the Linear methods switched onto the kernels.
"""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1 (see test_quant_triton_kernels.py)")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from loraplex.loader.quant import Quantizer, resolve_scheme  # noqa: E402
from loraplex.loader.quant.schemes import QuantScheme  # noqa: E402
from loraplex.loader.quant.weight_only import (  # noqa: E402
    dequantize_int4,
    dequantize_int8,
    quantize_int4_grouped,
    quantize_int8_per_channel,
)
from loraplex.platform.engine.layers.linear import Linear, MergedLinear  # noqa: E402
from loraplex.platform.engine.layers.quant import linear_quantization  # noqa: E402
from loraplex.platform.engine.layers.quant.triton_weight_only import (  # noqa: E402
    pack_int4,
    unpack_int4,
    w4a16_matmul,
    w8a16_matmul,
)

DTYPES = [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)]
N = 40  # not a multiple of the 32/64 column tile


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


def _data(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) / 16
    w[:, :128] *= 4  # groups of very different ranges
    x = torch.randn(m, k, generator=g).to(dtype)
    return w, x


@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("k", [256, 200])
@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_w8a16_matches_dequantize_then_matmul(m: int, k: int, dtype, tol: float) -> None:
    w, x = _data(m, N, k, dtype, seed=m)
    q, s = quantize_int8_per_channel(w)
    got = w8a16_matmul(x, q, s)
    assert got.dtype == dtype and got.shape == (m, N) and got.is_contiguous()
    want = x.float() @ dequantize_int8(q, s, torch.float32).T
    assert _rel(got, want) < tol


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_w4a16_matches_dequantize_then_matmul(symmetric: bool, m: int, dtype, tol: float) -> None:
    w, x = _data(m, N, 384, dtype, seed=10 + m)
    q, s, z = quantize_int4_grouped(w, 128, symmetric=symmetric)
    got = w4a16_matmul(x, pack_int4(q), s, None if symmetric else z, 128)
    assert got.dtype == dtype and got.shape == (m, N)
    want = x.float() @ dequantize_int4(q, s, z, torch.float32).T
    assert _rel(got, want) < tol
    if dtype == torch.float32:  # the kernel's error is far below the quantization's
        assert _rel(x @ w.T, want) > 100 * _rel(got, want)


def test_w4a16_group_64_and_a_wide_prefill() -> None:
    w, x = _data(70, 72, 256, torch.float16, seed=3)
    q, s, z = quantize_int4_grouped(w, 64, symmetric=False)
    got = w4a16_matmul(x, pack_int4(q), s, z, 64)
    assert _rel(got, x.float() @ dequantize_int4(q, s, z, torch.float32).T) < 2e-3


def test_int4_packing_is_two_codes_a_byte_low_nibble_first() -> None:
    codes = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 12]], dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x0F], [0x87, 0xC3]]
    assert torch.equal(unpack_int4(packed), codes)
    with pytest.raises(ValueError, match="K even"):
        pack_int4(torch.zeros(2, 3, dtype=torch.uint8))


def test_a_row_strided_x_is_read_in_place_and_a_transposed_x_is_copied() -> None:
    w, _ = _data(1, N, 256, torch.float32, seed=5)
    q, s = quantize_int8_per_channel(w)
    q4, s4, z4 = quantize_int4_grouped(w, 128, symmetric=False)
    p4 = pack_int4(q4)
    wide = torch.randn(5, 300)
    rows = wide[:, 20:276]  # row stride 300: a view the kernels read as it is
    assert not rows.is_contiguous() and rows.stride(1) == 1
    cols = torch.randn(256, 5).T  # last dimension not stride 1: copied first
    for x in (rows, cols):
        ref8 = x @ dequantize_int8(q, s, torch.float32).T
        ref4 = x @ dequantize_int4(q4, s4, z4, torch.float32).T
        assert _rel(w8a16_matmul(x, q, s), ref8) < 1e-5
        assert _rel(w4a16_matmul(x, p4, s4, z4, 128), ref4) < 1e-5


def test_strided_weights_and_wrong_shapes_are_refused() -> None:
    w, x = _data(3, 32, 256, torch.float32, seed=6)
    q, s = quantize_int8_per_channel(w)
    with pytest.raises(ValueError, match="qweight contiguous"):
        w8a16_matmul(x[:, :128], q[:, ::2], s)
    with pytest.raises(ValueError, match=r"x must be \[M, 256\]"):
        w8a16_matmul(x[:, :128], q, s)
    q4, s4, z4 = quantize_int4_grouped(w, 128, symmetric=False)
    packed = pack_int4(q4)
    with pytest.raises(ValueError, match="zero contiguous"):
        w4a16_matmul(x, packed, s4, z4.T.contiguous().T, 128)
    with pytest.raises(ValueError, match="scales"):
        w4a16_matmul(x, packed, s4[:, :1], None, 128)
    with pytest.raises(ValueError, match="multiple of 32"):
        w4a16_matmul(x, packed, s4, None, 100)
    assert w8a16_matmul(x[:0], q, s).shape == (0, 32)


@pytest.mark.parametrize("choice", ["int8", "int4", "int4_sym"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_methods_on_the_triton_kernels(choice: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(8)
    q_w, k_w = torch.randn(48, 256, generator=g) / 16, torch.randn(24, 256, generator=g)
    bias = torch.randn(72, generator=g) * 0.1
    with linear_quantization(resolve_scheme(choice)):
        fused = MergedLinear(256, [48, 24], ["q_proj", "k_proj"], bias=True, layer_idx=0,
                             dtype=dtype)  # fmt: skip
    ref = Linear(256, 72, bias=True, layer_idx=0, name="o_proj", dtype=torch.float32)
    ref.requires_grad_(False)
    fused.requires_grad_(False)  # as the engine serves it
    quantizer = Quantizer(choice)
    for name, w, rows in (("q_proj", q_w, slice(0, 48)), ("k_proj", k_w, slice(48, 72))):
        parts = {}
        for full, t in quantizer.apply(f"l.{name}.weight", w):
            fused.load_slice(name, t, piece=full.rsplit(".", 1)[1])
            parts[full.rsplit(".", 1)[1]] = t
        qc, sc = parts["weight"], parts["weight_scale"]
        with torch.no_grad():
            if choice == "int8":
                ref.weight[rows] = dequantize_int8(qc, sc, torch.float32)
            else:
                zero = parts.get("weight_zero", torch.full_like(sc, 8.0))
                ref.weight[rows] = dequantize_int4(qc, sc, zero, torch.float32)
    fused.load_slice("q_proj", bias[:48].to(dtype), is_bias=True)
    fused.load_slice("k_proj", bias[48:].to(dtype), is_bias=True)
    with torch.no_grad():
        ref.bias.copy_(bias.to(dtype).float())
    fused.quant_method.use_triton(fused)  # what finish_loading does on CUDA
    assert fused.quant_kernel == "triton"
    if choice.startswith("int4"):
        assert fused.weight.shape == (72, 128) and fused.weight.dtype == torch.uint8
    x = torch.randn(2, 3, 256, generator=g).to(dtype)
    got = fused(x)
    assert got.shape == (2, 3, 72) and got.dtype == dtype
    assert _rel(got, ref(x.float())) < (1e-5 if dtype == torch.float32 else 2e-3)


def test_act_order_input_order_on_the_triton_kernel() -> None:
    g = torch.Generator().manual_seed(11)
    out, inp = 40, 256
    parts = {
        "weight": torch.randint(0, 16, (out, inp), generator=g, dtype=torch.uint8),
        "weight_scale": torch.rand(out, inp // 128, generator=g) * 0.02 + 0.005,
        "weight_zero": torch.randint(0, 16, (out, inp // 128), generator=g).float(),
        "input_perm": torch.randperm(inp, generator=g),
    }
    scheme = QuantScheme("gptq", "int4", None, 128, symmetric=False, act_order=True)
    with linear_quantization(scheme):
        layer = Linear(inp, out, bias=False, layer_idx=0, name="o_proj", dtype=torch.float16)
    for piece, t in parts.items():
        layer.load_slice("o_proj", t, piece=piece)
    layer.quant_method.use_triton(layer)
    stored = dequantize_int4(
        parts["weight"], parts["weight_scale"], parts["weight_zero"], torch.float32
    )
    w = torch.empty_like(stored)
    w[:, parts["input_perm"]] = stored  # stored column j is input input_perm[j]
    x = torch.randn(3, inp, generator=g).to(torch.float16)
    assert _rel(layer(x), x.float() @ w.T) < 2e-3
    assert _rel(x.float() @ stored.T, x.float() @ w.T) > 0.1  # the order matters

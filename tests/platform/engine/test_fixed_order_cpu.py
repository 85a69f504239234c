"""The deterministic mode's fixed-order kernels (issue 23): a row's projection and RMSNorm are
the same bits alone, in a block of four (the AVX-512 path where the CPU has it), or anywhere in
a batch, and close to the fp32 reference."""

from __future__ import annotations

import pytest
import torch

from loraplex.platform.engine.layers.fixed_order_cpu import (
    FixedOrderWeight,
    fixed_order_available,
    fixed_order_linear,
    fixed_order_rmsnorm,
)

pytestmark = pytest.mark.skipif(not fixed_order_available(), reason="no C compiler here")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [256, 300, 7])
def test_a_row_is_the_same_bits_alone_or_in_any_batch(dtype: torch.dtype, k: int) -> None:
    g = torch.Generator().manual_seed(k)
    x = torch.randn(70, k, generator=g).to(dtype)
    w = torch.randn(133, k, generator=g).to(dtype)
    b = torch.randn(133, generator=g).to(dtype)
    full = fixed_order_linear(x, w, b)
    want = x.float() @ w.float().T + b.float()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert ((full.float() - want).abs() <= tol * (1 + want.abs())).all()
    for lo, hi in [(0, 1), (3, 4), (5, 9), (2, 7), (10, 70), (69, 70)]:
        assert torch.equal(fixed_order_linear(x[lo:hi], w, b), full[lo:hi]), (lo, hi)
    assert torch.equal(fixed_order_linear(x.view(7, 10, k), w, b).view(70, -1), full)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_rows_alone_or_together(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(33, 200, generator=g).to(dtype)
    w = torch.randn(200, generator=g).to(dtype)
    full = fixed_order_rmsnorm(x, w, 1e-6)
    h = x.float()
    want = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert ((full.float() - want.float()).abs() <= tol * (1 + want.float().abs())).all()
    for i in (0, 16, 32):
        assert torch.equal(fixed_order_rmsnorm(x[i : i + 1], w, 1e-6), full[i : i + 1])


def test_mismatched_dtypes_are_refused() -> None:
    with pytest.raises(ValueError, match="one dtype"):
        fixed_order_linear(torch.ones(2, 4), torch.ones(3, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="fp32/bf16 CPU"):
        fixed_order_linear(
            torch.ones(2, 4, dtype=torch.float16), torch.ones(3, 4, dtype=torch.float16)
        )


def test_a_quantized_weight_with_a_bias_of_another_dtype_is_refused() -> None:
    """The refusal names the dtypes without reading a dtype the quantized weight lacks."""
    codes = torch.ones(3, 4, dtype=torch.int8)
    weight = FixedOrderWeight("int8", codes, torch.ones(3, dtype=torch.float32))
    with pytest.raises(ValueError, match="one dtype, got torch.float32, quantized, torch.bfloat16"):
        fixed_order_linear(torch.ones(2, 4), weight, torch.ones(3, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_deterministic_mlp_row_is_the_same_bits_in_any_batch(tmp_path, dtype: str) -> None:
    """The gated MLP of a deterministic engine (intermediate 688: torch's fp32 SiLU splits such
    rows between threads at batch sizes past 48 and changes their bits): a row alone equals
    the same row in batches of 1..120."""
    from loraplex.bench._synthetic.models import save_tiny_model
    from loraplex.platform.engine import LLM

    save_tiny_model(tmp_path, "llama", seed=2, intermediate_size=688)
    llm = LLM(str(tmp_path), dtype=dtype, deterministic=True, max_loras=0)
    mlp = llm.core.model.model.layers[0].mlp
    x = torch.randn(120, 64, generator=torch.Generator().manual_seed(4)).to(llm.core.dtype)
    with torch.inference_mode():
        full = mlp(x)
        changed = [n for n in range(1, 121) if not torch.equal(mlp(x[:n]), full[:n])]
        alone = [i for i in range(0, 120, 7) if not torch.equal(mlp(x[i : i + 1]), full[i : i + 1])]
    assert not changed and not alone, (changed[:5], alone[:5])


def _quantized(kind: str, n: int, k: int, g: torch.Generator):
    """A FixedOrderWeight of `kind` [n, k] and the float weight it stands for."""
    from loraplex.moe.quant_experts import pack_nibbles
    from loraplex.platform.engine.layers.fixed_order_cpu import FixedOrderWeight

    if kind == "int8":
        q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        s = torch.rand(n, generator=g) / 50
        return FixedOrderWeight("int8", q, s), q.float() * s[:, None]
    if kind == "int8_grouped":
        q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        s = torch.rand(n, k // 32, generator=g) / 50
        w = (q.float().view(n, k // 32, 32) * s[..., None]).view(n, k)
        return FixedOrderWeight("int8", q, s, group=32), w
    if kind == "int4":
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        s, zf = torch.rand(n, k // 32, generator=g) / 10, torch.randn(n, k // 32, generator=g) / 10
        w = ((q.float() - 8).view(n, k // 32, 32) * s[..., None] + zf[..., None]).view(n, k)
        return FixedOrderWeight("int4", pack_nibbles(q), s, zf, 32), w
    codes = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn)
    s = torch.rand(n, generator=g) / 10
    return FixedOrderWeight("fp8", codes, s), codes.float() * s[:, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["int8", "int8_grouped", "int4", "fp8"])
def test_a_quantized_weights_rows_are_the_same_bits_in_any_batch(
    kind: str, dtype: torch.dtype
) -> None:
    """The kernel reads int8 / int4 / fp8 codes and their scales: a row alone equals the same
    row in any batch, and the product is the dequantized weight's."""
    g = torch.Generator().manual_seed(5)
    weight, w = _quantized(kind, 70, 96, g)
    x = torch.randn(37, 96, generator=g).to(dtype)
    b = torch.randn(70, generator=g).to(dtype)
    full = fixed_order_linear(x, weight, b)
    want = x.float() @ w.T + b.float()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert ((full.float() - want).abs() <= tol * (1 + want.abs())).all()
    for lo, hi in [(0, 1), (3, 4), (5, 9), (2, 7), (10, 37), (36, 37)]:
        assert torch.equal(fixed_order_linear(x[lo:hi], weight, b), full[lo:hi]), (lo, hi)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_scale_rows_alone_or_together(dtype: torch.dtype) -> None:
    from loraplex.platform.engine.layers.fixed_order_cpu import fixed_order_sigmoid_scale

    g = torch.Generator().manual_seed(6)
    gate, x = torch.randn(41, 1, generator=g).to(dtype), torch.randn(41, 24, generator=g).to(dtype)
    full = fixed_order_sigmoid_scale(gate, x)
    want = torch.sigmoid(gate.float()).to(dtype).float() * x.float()
    assert ((full.float() - want).abs() <= 1e-2 * (1 + want.abs())).all()
    for i in (0, 17, 40):
        assert torch.equal(
            fixed_order_sigmoid_scale(gate[i : i + 1], x[i : i + 1]), full[i : i + 1]
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_is_close_and_the_same_bits_at_any_width(dtype: torch.dtype) -> None:
    """SiLU-and-mul: within 2e-6 (fp32) of torch's, and an element's bits the same whatever the
    row's width around it (the vector loop's body or its tail)."""
    from loraplex.platform.engine.layers.fixed_order_cpu import fixed_order_silu_mul

    g = torch.Generator().manual_seed(7)
    gate = (torch.randn(9, 300, generator=g) * 6).to(dtype)
    up = torch.randn(9, 300, generator=g).to(dtype)
    full = fixed_order_silu_mul(torch.cat([gate, up], dim=-1))
    want = (torch.nn.functional.silu(gate.float()).to(dtype).float() * up.float()).to(dtype)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    assert ((full.float() - want.float()).abs() <= tol * (1 + want.float().abs())).all()
    for width in (1, 7, 16, 17, 63, 65):
        part = fixed_order_silu_mul(torch.cat([gate[:, :width], up[:, :width]], dim=-1))
        assert torch.equal(part, full[:, :width]), width

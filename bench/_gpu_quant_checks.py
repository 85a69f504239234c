"""Quantized-GEMM checks of `loraplex bench gpu-check`: the Triton W8A16 / W4A16 kernels against
the dequantize-then-matmul reference (`loader.quant.weight_only`), timed against that reference
and against a plain bf16/fp16 `F.linear` of the same shape.

Real sizes: in 4096 -> out 4096 and 4096 -> 14336 at M = 1, 16, 64 (decode to small prefill),
plus M = 1024 timed (where a prefill might rather dequantize and call cuBLAS); `tiny=True` runs
in 256 -> out 72 at M = 1, 3, 17 (how the CPU test proves the check code under
`TRITON_INTERPRET=1`) without timings. RESULT names: `gpu_check.<kernel>_<dtype>_<in>x<out>_m<M>_`
`ms` (the kernel), `_speedup_vs_dequant` and `_speedup_vs_dense` (their time over the kernel's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from loraplex.bench._gpu_kernel_checks import (
    DTYPE_TOL,
    CheckContext,
    CheckResult,
    dtype_name,
    rel_err,
    timed_ms,
)
from loraplex.loader.quant.weight_only import (
    dequantize_int4,
    dequantize_int8,
    quantize_int4_grouped,
    quantize_int8_per_channel,
)

GROUP = 128


def _shapes(ctx: CheckContext) -> tuple[list[tuple[int, int]], list[int]]:
    """[(out, in)] and the M values to run."""
    if ctx.tiny:
        return [(72, 256)], [1, 3, 17]
    return [(4096, 4096), (14336, 4096)], [1, 16, 64, 1024]


def _dequant_linear(
    x: torch.Tensor, dequant: Callable[[torch.dtype], torch.Tensor], dtype: torch.dtype
) -> Callable[[], torch.Tensor]:
    """The dequantize-then-matmul baseline, dequantizing inside the timed call."""
    return lambda: F.linear(x, dequant(dtype))


def _prepare(kind: str, w: torch.Tensor, dev: str):  # noqa: ANN202
    """(kernel(x), dequantize(dtype)) for one quantized weight: the pair the check compares."""
    from loraplex.platform.engine.layers.quant.triton_weight_only import (
        pack_int4,
        w4a16_matmul,
        w8a16_matmul,
    )

    if kind == "w8a16":
        q, s = (t.to(dev) for t in quantize_int8_per_channel(w))
        return _bind(w8a16_matmul, q, s), lambda dt: dequantize_int8(q, s, dt)
    symmetric = kind == "w4a16_sym"
    q, s, z = (t.to(dev) for t in quantize_int4_grouped(w, GROUP, symmetric=symmetric))
    packed = pack_int4(q)
    zero = None if symmetric else z.contiguous()
    return (
        _bind(w4a16_matmul, packed, s.contiguous(), zero, GROUP),
        lambda dt: dequantize_int4(q, s, z, dt),
    )


def _bind(fn: Callable[..., torch.Tensor], *args: object) -> Callable[[torch.Tensor], torch.Tensor]:
    """fn with everything but x bound: `call(x) = fn(x, *args)`."""
    return lambda x: fn(x, *args)


def weight_only_gemm(ctx: CheckContext, dtype: torch.dtype, bits: int) -> CheckResult:
    """W8A16 (bits 8) or W4A16 sym + asym g128 (bits 4) vs dequantize-then-matmul and dense."""
    kinds = ["w8a16"] if bits == 8 else ["w4a16_sym", "w4a16"]
    dev = ctx.device
    shapes, ms = _shapes(ctx)
    g = torch.Generator().manual_seed(bits)
    results: dict[str, float] = {}
    worst = 0.0
    for out_f, in_f in shapes:
        w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
        dense_w = w.to(dtype).to(dev)
        for kind in kinds:
            kernel, dequant = _prepare(kind, w.to(dev), dev)
            ref_w = dequant(torch.float32)
            for m in ms:
                x = torch.randn(m, in_f, generator=g).to(dtype).to(dev)
                got = kernel(x)
                worst = max(worst, rel_err(got, x.float() @ ref_w.T))
                if ctx.tiny or kind == "w4a16_sym":
                    continue
                tag = f"gpu_check.{kind}_{dtype_name(dtype)}_{in_f}x{out_f}_m{m}"
                t_kernel = timed_ms(functools.partial(kernel, x), dev, iters=20)
                t_deq = timed_ms(_dequant_linear(x, dequant, dtype), dev, iters=20)
                t_dense = timed_ms(functools.partial(F.linear, x, dense_w), dev, iters=20)
                results[f"{tag}_ms"] = t_kernel
                results[f"{tag}_speedup_vs_dequant"] = t_deq / t_kernel
                results[f"{tag}_speedup_vs_dense"] = t_dense / t_kernel
    name = f"gpu_check.w{bits}a16_{dtype_name(dtype)}_rel_err"
    results[name] = worst
    return worst <= DTYPE_TOL[dtype], f"{'/'.join(kinds)}, rel err {worst:.2e}", results

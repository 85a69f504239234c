"""Kernel checks of `loraplex bench gpu-check`: each Triton kernel against its torch reference.

Each check runs natively on the device in the dtype given (bf16, fp16), at the real sizes
of the issue (`tiny=False`), or at tiny sizes (`tiny=True`, what the CPU test runs under
`TRITON_INTERPRET=1` to prove the check code itself). A check returns
(passed, detail, {RESULT name: value}).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

CheckResult = tuple[bool, str, dict[str, float]]
DTYPE_TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}


@dataclass(frozen=True)
class CheckContext:
    """Where and at what size the checks run."""

    device: str
    tiny: bool


def dtype_name(dtype: torch.dtype) -> str:
    """bf16 / fp16 / fp32, for RESULT names."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def call_times_ms(fn: Callable[[], object], device: str, iters: int) -> list[float]:
    """Milliseconds of each of `iters` calls of `fn` on `device` (synchronised), sorted, after
    one warm-up call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)


def timed_ms(fn: Callable[[], object], device: str, iters: int = 10) -> float:
    """Median milliseconds of `fn` on `device` (synchronised)."""
    times = call_times_ms(fn, device, iters)
    return times[len(times) // 2]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max |want| (the scale-free error the tolerances bound)."""
    want = want.float()
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6))


def paged_decode(ctx: CheckContext, dtype: torch.dtype) -> CheckResult:
    """Paged decode attention, head_dim 128, 32 query heads over 8 KV heads, contexts to 8k."""
    from loraplex.platform.engine.layers.paged_attention_torch import decode_attention_torch
    from loraplex.platform.engine.layers.paged_attention_triton import decode_attention_triton

    if ctx.tiny:
        d, hq, hkv, bs, lens = 32, 4, 2, 4, [1, 5, 17, 40]
    else:
        d, hq, hkv, bs, lens = 128, 32, 8, 16, [1, 17, 511, 1000, 2048, 4096, 8000, 8192]
    g = torch.Generator().manual_seed(0)
    width = max(-(-n // bs) for n in lens)
    num_blocks = len(lens) * width + 1
    dev = ctx.device
    kv = torch.randn(2, num_blocks, bs, hkv, d, generator=g).to(dtype).to(dev)
    perm = torch.randperm(num_blocks, generator=g)[: len(lens) * width]
    tables = perm.view(len(lens), width).to(torch.int32).to(dev)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(len(lens), hq, d, generator=g).to(dtype).to(dev)
    scale = d**-0.5
    got = decode_attention_triton(q, kv, tables, seq_lens, scale)
    want = decode_attention_torch(q.float(), kv.float(), tables, seq_lens, max(lens), scale)
    err = rel_err(got, want)
    ms = timed_ms(lambda: decode_attention_triton(q, kv, tables, seq_lens, scale), dev)
    tag = f"gpu_check.paged_decode_{dtype_name(dtype)}"
    ok = err <= DTYPE_TOL[dtype]
    return ok, f"rel err {err:.2e}, {ms:.3f} ms", {f"{tag}_rel_err": err, f"{tag}_ms": ms}


def _lora_adapters(n: int, ranks: list[int], dims: dict[str, tuple[int, int]], dtype, seed: int):  # noqa: ANN001, ANN202
    from loraplex.adapters.targets import ModuleTarget, ResolvedTargets
    from loraplex.adapters.weights import LoadedAdapter, ModuleLora

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        r = ranks[i % len(ranks)]
        modules = {
            (0, name): ModuleLora(
                a=(torch.randn(r, din, generator=g) / math.sqrt(din)).to(dtype),
                b=(torch.randn(dout, r, generator=g) / math.sqrt(r)).to(dtype),
                scale=2.0,
            )
            for name, (din, dout) in dims.items()
        }
        targets = ResolvedTargets(
            {k: ModuleTarget(m.rank, 2.0 * m.rank, 2.0) for k, m in modules.items()}
        )
        out.append(LoadedAdapter(key=f"gpu-check-{i}", targets=targets, modules=modules))
    return out


def lora_shrink_expand(ctx: CheckContext, dtype: torch.dtype) -> CheckResult:
    """LoRA shrink/expand, ranks 8-64, over 4096x4096 and 4096x14336, 32 adapters mixed."""
    from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
    from loraplex.adapters.kernels.lora_torch import lora_delta_torch
    from loraplex.adapters.kernels.lora_triton import lora_delta_triton
    from loraplex.adapters.metadata import build_lora_meta

    h, inter, n_ad, ranks = (
        (64, 224, 6, [8, 16]) if ctx.tiny else (4096, 14336, 32, [8, 16, 32, 64])
    )
    dims = {"o_proj": (h, h), "up_proj": (h, inter)}
    specs = [LoraLinearSpec(0, ("o_proj",), h, (h,)), LoraLinearSpec(0, ("up_proj",), h, (inter,))]
    rows = sum(ranks[i % len(ranks)] for i in range(n_ad))
    cap = rows * DevicePool.bytes_per_row(specs, dtype)
    pool = DevicePool(specs, cap, max(ranks), dtype=dtype, device=ctx.device)
    residents = [pool.load(a) for a in _lora_adapters(n_ad, ranks, dims, dtype, seed=3)]
    results: dict[str, float] = {}
    worst = 0.0
    for tokens in (64, 512) if not ctx.tiny else (12,):
        # decode-like rows: each token on one of the adapters, every 8th on the base model
        seqs = [(None if t % 8 == 7 else residents[t % n_ad], 1) for t in range(tokens)]
        meta = build_lora_meta(
            seqs, max_loras=n_ad, num_linears=len(specs), max_slices=1, device=ctx.device
        )
        g = torch.Generator().manual_seed(tokens)
        for lid, spec in enumerate(specs):
            x = torch.randn(tokens, spec.in_features, generator=g).to(dtype).to(ctx.device)
            y = torch.zeros(tokens, spec.out_features, dtype=dtype, device=ctx.device)
            want = torch.zeros(tokens, spec.out_features, device=ctx.device)
            a, b = pool.a[lid], pool.b[lid]
            lora_delta_triton(
                x, y, a, b, meta, lid, spec.slice_offsets, spec.slice_sizes, max(ranks)
            )
            lora_delta_torch(
                x.float(), want, a.float(), b.float(), meta, lid, spec.slice_offsets,
                spec.slice_sizes,
            )  # fmt: skip
            worst = max(worst, rel_err(y, want))
            if not ctx.tiny:
                name = f"gpu_check.lora_{dtype_name(dtype)}_{h}x{spec.out_features}_t{tokens}_ms"
                run = partial(
                    lora_delta_triton, x, y, a, b, meta, lid, spec.slice_offsets,
                    spec.slice_sizes, max(ranks),
                )  # fmt: skip
                results[name] = timed_ms(run, ctx.device)
    results[f"gpu_check.lora_{dtype_name(dtype)}_rel_err"] = worst
    return worst <= DTYPE_TOL[dtype], f"{n_ad} adapters, rel err {worst:.2e}", results


def grouped_moe(ctx: CheckContext, dtype: torch.dtype) -> CheckResult:
    """Grouped-GEMM MoE at Mixtral shapes (8 experts, 4096 -> 14336, top 2)."""
    from loraplex.moe.experts_torch import fused_experts_torch
    from loraplex.moe.experts_triton import fused_experts_triton

    e, h, inter, top_k = (4, 64, 96, 2) if ctx.tiny else (8, 4096, 14336, 2)
    dev = ctx.device
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = (torch.randn(e, 2 * inter, h, generator=g, device=dev) / math.sqrt(h)).to(dtype)
    w2 = (torch.randn(e, h, inter, generator=g, device=dev) / math.sqrt(inter)).to(dtype)
    results: dict[str, float] = {}
    worst = 0.0
    for tokens in (16,) if ctx.tiny else (64, 1024):
        x = torch.randn(tokens, h, generator=g, device=dev).to(dtype)
        logits = torch.randn(tokens, e, generator=g, device=dev)
        weights, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
        got = fused_experts_triton(x, w13, w2, weights, ids)
        want = fused_experts_torch(x.float(), w13.float(), w2.float(), weights, ids)
        worst = max(worst, rel_err(got, want))
        if not ctx.tiny:
            run = partial(fused_experts_triton, x, w13, w2, weights, ids)
            results[f"gpu_check.moe_{dtype_name(dtype)}_t{tokens}_ms"] = timed_ms(run, dev)
    results[f"gpu_check.moe_{dtype_name(dtype)}_rel_err"] = worst
    return worst <= DTYPE_TOL[dtype], f"rel err {worst:.2e}", results


def grouped_moe_quant(ctx: CheckContext, dtype: torch.dtype) -> CheckResult:
    """Grouped MoE over int8 / int4 (g128) / fp8 experts at Mixtral shapes vs torch on the
    dequantized stacks; at real sizes, ms per step beside the float kernel's (same run)."""
    from loraplex.moe.experts_torch import fused_experts_torch
    from loraplex.moe.experts_triton import fused_experts_triton
    from loraplex.moe.quant_experts import QuantizedExperts, quantize_rows

    e, h, inter, top_k = (4, 128, 128, 2) if ctx.tiny else (8, 4096, 14336, 2)
    dev, name = ctx.device, dtype_name(dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = (torch.randn(e, 2 * inter, h, generator=g, device=dev) / math.sqrt(h)).to(dtype)
    w2 = (torch.randn(e, h, inter, generator=g, device=dev) / math.sqrt(inter)).to(dtype)
    batches = []
    for tokens in (16,) if ctx.tiny else (64, 1024):
        x = torch.randn(tokens, h, generator=g, device=dev).to(dtype)
        logits = torch.randn(tokens, e, generator=g, device=dev)
        weights, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
        batches.append((tokens, x, weights, ids))
    float_ms = {  # the float kernel on the same batches: the side-by-side baseline
        b[0]: timed_ms(partial(fused_experts_triton, b[1], w13, w2, b[2], b[3]), dev)
        for b in batches
        if not ctx.tiny
    }
    results: dict[str, float] = {}
    worst = 0.0
    for kind, sym in (("int8", True), ("int4", False), ("fp8", True)):
        stacks = []
        for w in (w13, w2):  # one expert at a time: the fp32 temporaries stay small
            parts = [quantize_rows(kind, w[i], 128, sym, dtype) for i in range(e)]
            codes = torch.stack([c for c, _ in parts])
            scale = torch.stack([s for _, s in parts])
            stacks.append(QuantizedExperts(kind, codes, scale, 128 if kind == "int4" else 0))
        deq = [torch.stack([q.dequantize(i, torch.float32) for i in range(e)]) for q in stacks]
        key = f"gpu_check.moe_quant_{kind}_{name}"
        for tokens, x, weights, ids in batches:
            got = fused_experts_triton(x, stacks[0], stacks[1], weights, ids)
            want = fused_experts_torch(x.float(), deq[0], deq[1], weights, ids)
            err = rel_err(got, want)
            worst = max(worst, err)
            results[f"{key}_rel_err"] = max(err, results.get(f"{key}_rel_err", 0.0))
            if tokens in float_ms:
                run = partial(fused_experts_triton, x, stacks[0], stacks[1], weights, ids)
                ms = timed_ms(run, dev)
                results[f"{key}_t{tokens}_ms"] = ms
                results[f"{key}_t{tokens}_speedup"] = float_ms[tokens] / ms
        del stacks, deq
    return worst <= DTYPE_TOL[dtype], f"int8/int4/fp8 worst rel err {worst:.2e}", results

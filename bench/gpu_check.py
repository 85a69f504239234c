"""`loraplex bench gpu-check`: everything CUDA-only, run once on the first GPU at hand.

No GPU has run the CUDA paths yet; this command proves or disproves them in one go (meant to
finish in under 10 minutes on one modern GPU) and prints a pass/fail table plus RESULT lines:

- the CUDA-only tests (pytest);
- each Triton kernel against its torch reference, natively, in bf16 and fp16, at real sizes:
  paged decode attention (head_dim 128, 32 query heads over 8 KV heads, contexts to 8k), LoRA
  shrink/expand (ranks 8-64 over 4096x4096 and 4096x14336, 32 adapters mixed), grouped MoE
  at Mixtral shapes, the W8A16 / W4A16 GEMMs (4096x4096 and 4096x14336 at M 1/16/64, timed
  against dequantize+matmul and against a dense F.linear);
- decode replayed from CUDA graphs vs the same engine with `enforce_eager=True`, with and
  without adapters;
- expert parallelism over NCCL on the GPUs present (skipped with one GPU);
- the loader into pinned host memory and on to the device;
- `bench graphs`, and the decode bandwidth of an 8B-shaped Llama at batch 1 and 64 as a
  fraction of the device's memory bandwidth (target >= 0.7 at batch 64).

`--dry-run` lists the checks and exits 0 anywhere; `--tiny` runs the kernel checks at tiny
sizes (on CPU under `TRITON_INTERPRET=1`: how the tests prove the check code). Without CUDA
and without those flags it says so and exits 2. `--only NAME` (repeatable) picks checks.
Exit status: 0 when every check that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from loraplex.bench import _gpu_engine_checks as eng
from loraplex.bench import _gpu_kernel_checks as ker
from loraplex.bench import _gpu_quant_checks as qnt
from loraplex.bench._gpu_kernel_checks import CheckContext


@dataclass(frozen=True)
class Check:
    """One named check: what it proves, whether it is a kernel check (runs with --tiny)."""

    name: str
    what: str
    fn: Callable[[CheckContext], tuple[bool | None, str, dict[str, float]]]
    kernel: bool = False


def all_checks(bandwidth_layers: int = 32) -> list[Check]:
    """Every check, in the order they run (cheap and fundamental first)."""
    checks = []
    for dtype in (torch.bfloat16, torch.float16):
        n = ker.dtype_name(dtype)
        checks += [
            Check(f"paged_decode_{n}", f"Triton paged decode attention vs torch, {n}, "
                  "D 128, 32/8 heads, contexts to 8k", partial(ker.paged_decode, dtype=dtype), True),
            Check(f"lora_{n}", f"Triton LoRA shrink/expand vs torch, {n}, ranks 8-64, "
                  "4096x4096 and 4096x14336, 32 adapters", partial(ker.lora_shrink_expand, dtype=dtype), True),
            Check(f"moe_{n}", f"Triton grouped MoE vs torch, {n}, Mixtral 8x(4096->14336) top-2",
                  partial(ker.grouped_moe, dtype=dtype), True),
            Check(f"w8a16_{n}", f"Triton W8A16 GEMM vs dequantize+matmul and dense {n}, "
                  "4096->4096 and 4096->14336, M 1/16/64 (+1024 timed)", partial(qnt.weight_only_gemm, dtype=dtype, bits=8), True),
            Check(f"w4a16_{n}", f"Triton W4A16 GEMM (g128 sym and asym) vs dequantize+matmul and "
                  f"dense {n}, 4096->4096 and 4096->14336, M 1/16/64 (+1024 timed)",
                  partial(qnt.weight_only_gemm, dtype=dtype, bits=4), True),
            Check(f"moe_quant_{n}", f"Triton grouped MoE over int8/int4/fp8 experts vs torch, {n}, "
                  "Mixtral shapes", partial(ker.grouped_moe_quant, dtype=dtype), True),
        ]  # fmt: skip
    checks += [
        Check("cuda_tests", "the CUDA-only pytest files: " + ", ".join(eng.CUDA_TEST_FILES), eng.cuda_tests),
        Check("graphs_vs_eager", "decode from CUDA graphs vs enforce_eager=True, greedy tokens "
              "equal, with and without adapters", eng.graphs_vs_eager),
        Check("ep_nccl", "expert parallelism over NCCL on every GPU vs one process", eng.ep_nccl),
        Check("loader_pinned", "streaming loader via pinned host slots to the device "
              f"({eng.LOADER_CUDA_TEST})", eng.loader_pinned),
        Check("bench_graphs", "`loraplex bench graphs`: graph replay vs eager decode step", eng.bench_graphs),
        Check("decode_bandwidth", f"8B-shaped Llama ({bandwidth_layers} layers, bf16) decode "
              "at b1/b64 as a fraction of device bandwidth (>= 0.7 at b64)",
              partial(eng.decode_bandwidth, layers=bandwidth_layers)),
    ]  # fmt: skip
    return checks


def run_checks(checks: list[Check], ctx: CheckContext) -> list[tuple[Check, str, str, float, dict]]:
    """Run each check; a raised exception is a failure with its message (the rest still run)."""
    rows = []
    for c in checks:
        print(f"[gpu-check] {c.name}: {c.what}", flush=True)
        t0 = time.perf_counter()
        try:
            ok, detail, results = c.fn(ctx)
            status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        except Exception as e:  # noqa: BLE001  (a failing check is a result, not a crash)
            traceback.print_exc()
            status, detail, results = "FAIL", f"{type(e).__name__}: {e}"[:200], {}
        rows.append((c, status, detail, time.perf_counter() - t0, results))
        print(f"[gpu-check] {c.name}: {status} ({detail})", flush=True)
    return rows


def print_table(rows: list[tuple[Check, str, str, float, dict]]) -> None:
    """The pass/fail table, then every RESULT line."""
    width = max(len(c.name) for c, *_ in rows)
    print(f"\n{'check':<{width}}  status  seconds  detail")
    for c, status, detail, secs, _ in rows:
        print(f"{c.name:<{width}}  {status:<6}  {secs:7.1f}  {detail}")
    for c, status, *_, results in rows:
        print(f"RESULT gpu_check.{c.name}_pass={1 if status == 'PASS' else 0}")
        for name, value in results.items():
            print(f"RESULT {name}={value:.4g}")


def main(argv: list[str] | None = None) -> int:
    """List or run the checks; exit 0 when all that ran passed."""
    ap = argparse.ArgumentParser(
        prog="loraplex bench gpu-check", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--dry-run", action="store_true", help="list the checks, run nothing")
    ap.add_argument("--tiny", action="store_true", help="kernel checks only, at tiny sizes")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu with --tiny")
    ap.add_argument("--only", action="append", default=[], help="run only these checks")
    ap.add_argument("--bandwidth-layers", type=int, default=32)
    args = ap.parse_args(argv)
    checks = all_checks(args.bandwidth_layers)
    if args.only:
        unknown = set(args.only) - {c.name for c in checks}
        if unknown:
            ap.error(f"unknown checks: {', '.join(sorted(unknown))}")
        checks = [c for c in checks if c.name in args.only]
    if args.tiny:
        checks = [c for c in checks if c.kernel]
    if args.dry_run:
        for c in checks:
            print(f"{c.name}: {c.what}")
        print(f"{len(checks)} checks")
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("loraplex bench gpu-check needs a CUDA device and none is here; nothing ran "
              "(--dry-run lists the checks)")  # fmt: skip
        return 2
    rows = run_checks(checks, CheckContext(args.device, args.tiny))
    print_table(rows)
    return 0 if all(status != "FAIL" for _, status, *_ in rows) else 1

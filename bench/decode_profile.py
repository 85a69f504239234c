"""`loraplex bench decode_profile`: where a decode step's time goes (torch.profiler).

Builds the peer workload's tiny Llama (see `peer.py`), prefills `--requests` requests (base,
or `--adapters` rank-8 adapters mixed), then profiles `--steps` decode steps of
`EngineCore.step()` and prints the top ops by self CPU time and:

- decode_profile.<variant>_step_ms: median wall time of one engine step;
- decode_profile.<variant>_op_fraction: the share of the step spent inside torch ops (the
  rest is Python: scheduling, building inputs, sampling bookkeeping); the gap to 1 is the
  per-step overhead worth cutting.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def _prefill(core, prompts, refs) -> None:  # noqa: ANN001
    from loraplex.platform.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)
    for i, (p, r) in enumerate(zip(prompts, refs, strict=True)):
        core.add_request(p, sp, f"prof-{i}", r)
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step()


def profile_variant(
    model: Path, prompts, refs, steps: int, dtype: str, top: int
) -> dict[str, float]:  # noqa: ANN001
    """Profile `steps` decode steps of one engine; returns its RESULT values."""
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.lora.runtime import LoraRuntime
    from loraplex.platform.engine_spec.config import EngineConfig

    lora = any(r is not None for r in refs)
    core = EngineCore(
        EngineConfig(
            model=str(model), dtype=dtype, max_num_seqs=len(prompts), max_model_len=512,
            max_num_batched_tokens=2048, max_loras=max(1, len({*refs} - {None})), max_lora_rank=8,
        )
    )  # fmt: skip
    if lora:
        core.install_lora_runtime(LoraRuntime.for_engine(core))
    _prefill(core, prompts, refs)
    for _ in range(3):
        core.step()
    times = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            core.step()
            times.append(time.perf_counter() - t0)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    ops_us = sum(e.self_cpu_time_total for e in prof.key_averages())
    wall_us = sum(times) * 1e6
    if core.lora_runtime is not None:
        core.lora_runtime.detach()
    return {"step_ms": statistics.median(times) * 1e3, "op_fraction": min(1.0, ops_us / wall_us)}


def main(argv: list[str] | None = None) -> int:
    """Profile base and mixed-adapter decode steps; print RESULT lines."""
    from loraplex.bench.peer import build, workload
    from loraplex.platform.engine.compute_dtype import auto_compute_dtype

    ap = argparse.ArgumentParser(
        prog="loraplex bench decode_profile", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    vocab = 1000 if args.quick else 32000
    if args.quick:
        args.requests, args.steps, args.top = 8, 3, 5
    dtype = auto_compute_dtype("cpu").name
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as name:
        model, dirs = build(Path(name), vocab, args.adapters)
        prompts = workload(args.requests, vocab)
        variants = {
            "base": [None] * len(prompts),
            f"mixed{args.adapters}": [dirs[i % len(dirs)] for i in range(len(prompts))],
        }
        for variant, refs in variants.items():
            print(
                f"== {variant}: {len(prompts)} rows, dtype {dtype}, {torch.get_num_threads()} threads"
            )
            for k, v in profile_variant(model, prompts, refs, args.steps, dtype, args.top).items():
                results[f"decode_profile.{variant}_{k}"] = v
    for k, v in results.items():
        print(f"RESULT {k}={v:.3f}")
    return 0

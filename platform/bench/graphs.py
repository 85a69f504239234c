"""`loraplex bench graphs`: the engine's decode step replayed from CUDA graphs vs run eager.

GPU only. Builds a random Llama (needs `transformers`, a test dependency), starts an engine on
the GPU that captures its decode graphs, prefills a batch of requests, then times one decode
step of that batch both ways on the same prepared inputs:

- engine.graph_decode_step_ms: replay of the captured graph (inputs copied into its buffers);
- engine.eager_decode_step_ms: the same forward launched op by op (the baseline);
- engine.graph_speedup: eager over graph.

On a machine without CUDA it says so and exits 0 without RESULT lines.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from loraplex.loader.cuda_graphs import time_step


def build_parser() -> argparse.ArgumentParser:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(prog="loraplex bench graphs", description=__doc__)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="decode batch (a captured size)")
    p.add_argument("--context", type=int, default=250, help="prompt tokens per request")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--dtype", default="bfloat16")
    return p


def measure(path: str, args: argparse.Namespace) -> tuple[float, float]:
    """(graph seconds, eager seconds) per decode step of `args.batch` requests."""
    from loraplex.platform.engine.config import EngineConfig
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.sampling_params import SamplingParams

    b = args.batch
    max_len = args.context + 64
    core = EngineCore(
        EngineConfig(
            model=path,
            device="cuda",
            dtype=args.dtype,
            max_num_seqs=b,
            max_num_batched_tokens=max(2048, b * args.context),
            max_model_len=max_len,
            num_gpu_blocks=b * (-(-max_len // 16)) + 8,
            cuda_graph_sizes=[b],
        )
    )
    if b not in core.runner.decode_graphs:
        raise SystemExit(f"no decode graph was captured for batch {b}")
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for i in range(b):
        prompt = torch.randint(3, core.vocab_size, (args.context,), generator=gen).tolist()
        core.add_request(prompt, params, f"bench-{i}")
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step()  # prefill every request
    sched = core.scheduler.schedule()  # a decode-only step: slots for the next tokens
    runner = core.runner
    runner.prepare_decode_inputs([s.request for s in sched.scheduled], b)
    graph = runner.decode_graphs[b]
    with torch.inference_mode():
        graph_s = time_step(graph, args.iters)
        eager_s = time_step(lambda: runner.run_decode_step(b), args.iters)
    return graph_s, eager_s


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print RESULT lines on a GPU, a clear message elsewhere."""
    args = build_parser().parse_args(argv or [])
    if not torch.cuda.is_available():
        print(
            "loraplex bench graphs needs a CUDA GPU (it times CUDA graph replay against eager "
            "decode); none is available here, so nothing was measured."
        )
        return 0
    from loraplex.platform.bench.engine import save_bench_model

    with tempfile.TemporaryDirectory(prefix="loraplex-bench-graphs-") as tmp:
        save_bench_model(Path(tmp), args.layers, args.hidden, args.context + 64)
        graph_s, eager_s = measure(tmp, args)
    print(f"decode step, batch {args.batch}, {args.layers} layers x {args.hidden} hidden")
    print(f"RESULT engine.graph_decode_step_ms={graph_s * 1e3:.4f}")
    print(f"RESULT engine.eager_decode_step_ms={eager_s * 1e3:.4f}")
    print(f"RESULT engine.graph_speedup={eager_s / graph_s:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`loraplex bench graphs`: the engine's decode step replayed from CUDA graphs vs run eager.

GPU only. Builds a random Llama (needs `transformers`, a test dependency), starts an engine on
the GPU that captures its decode graphs, prefills a batch of requests, then times one decode
step of that batch both ways on the same prepared inputs:

- engine.graph_decode_step_ms: replay of the captured graph (inputs copied into its buffers);
- engine.eager_decode_step_ms: the same forward launched op by op (the baseline);
- engine.graph_speedup: eager over graph;
- engine.graph_lora_decode_step_ms / engine.eager_lora_decode_step_ms: the same with a LoRA
  runtime installed (graphs recaptured with adapters) and `--adapters` adapters of rank
  `--rank` spread over the batch next to base rows; the replay includes copying the step's
  LoRA metadata into the graphs' static buffers;
- engine.graph_lora_speedup: eager over graph, with adapters.

On a machine without CUDA it says so and exits 0 without RESULT lines.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from loraplex.platform.engine.cuda_graphs import time_step


def build_parser() -> argparse.ArgumentParser:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(prog="loraplex bench graphs", description=__doc__)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="decode batch (a captured size)")
    p.add_argument("--context", type=int, default=250, help="prompt tokens per request")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--adapters", type=int, default=4, help="adapters in the LoRA batch")
    p.add_argument("--rank", type=int, default=16, help="their rank (all seven projections)")
    return p


def measure(
    path: str, args: argparse.Namespace, lora_dirs: list[Path] | None = None
) -> tuple[float, float]:
    """(graph seconds, eager seconds) per decode step of `args.batch` requests.

    With `lora_dirs`, a LoRA runtime is installed (the graphs are recaptured with adapters)
    and the requests cycle through the adapters and the base model.
    """
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.sampling_params import SamplingParams
    from loraplex.platform.engine_spec.config import EngineConfig

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
            max_loras=max(1, len(lora_dirs or [])),
            max_lora_rank=args.rank,
        )
    )
    refs: list[str | None] = [None] * b
    if lora_dirs:
        from loraplex.platform.engine.lora.runtime import LoraRuntime

        core.install_lora_runtime(LoraRuntime.for_engine(core))
        if not core.runner.decode_graphs_have_lora:
            raise SystemExit("the decode graphs were not recaptured with LoRA")
        cycle = [str(d) for d in lora_dirs] + [None]
        refs = [cycle[i % len(cycle)] for i in range(b)]
    if b not in core.runner.decode_graphs:
        raise SystemExit(f"no decode graph was captured for batch {b}")
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for i in range(b):
        prompt = torch.randint(3, core.vocab_size, (args.context,), generator=gen).tolist()
        core.add_request(prompt, params, f"bench-{i}", refs[i])
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step()  # prefill every request
    sched = core.scheduler.schedule()  # a decode-only step: slots for the next tokens
    runner = core.runner
    requests = [s.request for s in sched.scheduled]
    if lora_dirs:
        assert core.lora_runtime is not None  # adapters given: the core serves LoRA
        runner.lora_metadata = core.lora_runtime.prepare_step(requests, [1] * b)
    runner.prepare_decode_inputs(requests, b)
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
    from loraplex.bench._synthetic.adapters import write_random_adapter
    from loraplex.bench.engine import save_bench_model

    with tempfile.TemporaryDirectory(prefix="loraplex-bench-graphs-") as tmp:
        save_bench_model(Path(tmp), args.layers, args.hidden, args.context + 64)
        graph_s, eager_s = measure(tmp, args)
        hf_config = json.loads((Path(tmp) / "config.json").read_text())
        dirs = [
            write_random_adapter(Path(tmp) / f"adapter-{i}", hf_config, args.rank, seed=i)
            for i in range(args.adapters)
        ]
        lora = measure(tmp, args, dirs) if dirs else None
    print(f"decode step, batch {args.batch}, {args.layers} layers x {args.hidden} hidden")
    print(f"RESULT engine.graph_decode_step_ms={graph_s * 1e3:.4f}")
    print(f"RESULT engine.eager_decode_step_ms={eager_s * 1e3:.4f}")
    print(f"RESULT engine.graph_speedup={eager_s / graph_s:.3f}")
    if lora is not None:
        print(f"with {args.adapters} adapters of rank {args.rank} and base rows in the batch")
        print(f"RESULT engine.graph_lora_decode_step_ms={lora[0] * 1e3:.4f}")
        print(f"RESULT engine.eager_lora_decode_step_ms={lora[1] * 1e3:.4f}")
        print(f"RESULT engine.graph_lora_speedup={lora[1] / lora[0]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

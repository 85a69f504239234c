"""`loraplex bench engine`: continuous batching, prefix caching and chunked prefill, measured.

Builds a tiny random-weight Llama in a temporary folder (needs `transformers`, a test
dependency), then prints, each against a baseline measured in the same run:

- engine.continuous_over_static: output tok/s of continuous batching over static batching of
  the same requests on the same engine: groups of `max_num_seqs` requests, each group decoding
  until its longest member ends (finished rows keep their slot, as in static batching), counting
  only each request's own tokens;
- engine.over_hf_generate: our output tok/s over transformers `generate` on the same
  requests (static batches, left padding; only each request's own tokens counted);
- engine.prefix_hit_ttft_speedup: time to first token with a 2,000-token prefix cold vs cached;
- engine.itl_p95_ms_chunked / _unchunked: p95 inter-token latency of running streams while a
  4,000-token prompt arrives, chunked prefill on vs off.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from loraplex.platform.engine.engine_core import EngineCore
from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams


@dataclass
class Workload:
    """Requests with mixed prompt and output lengths (token-id prompts, fixed output lengths)."""

    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def total_output(self) -> int:
        """Output tokens the workload produces."""
        return sum(self.max_tokens)


def make_workload(n: int, vocab: int, seed: int, long_frac: float = 0.25) -> Workload:
    """Mostly short answers and some long ones, as chat traffic has."""
    rng = random.Random(seed)
    prompts, outs = [], []
    for _ in range(n):
        prompts.append([rng.randrange(3, vocab) for _ in range(rng.randint(16, 200))])
        long = rng.random() < long_frac
        outs.append(rng.randint(160, 288) if long else rng.randint(8, 40))
    return Workload(prompts, outs)


def save_bench_model(path: Path, layers: int, hidden: int, max_len: int) -> int:
    """A random Llama saved as a HuggingFace folder; returns its vocab size."""
    from loraplex.bench._synthetic.models import save_random_model

    vocab = 2048
    save_random_model(
        path, "llama", seed=0, init="hf", tiny=False,
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128), max_position_embeddings=max_len,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return vocab


def params_for(max_tokens: int) -> SamplingParams:
    """Greedy, exact length: the benchmark compares speed, not content."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def timed(fn: Callable[[], object]) -> float:
    """Seconds `fn` takes."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_throughput(path: str, wl: Workload, seqs: int, repeats: int) -> tuple[float, float]:
    """(continuous tok/s, static tok/s) on the same engine settings; best of `repeats`,
    alternating the two so a noisy neighbour hurts both alike."""
    llm = LLM(path, max_num_seqs=seqs, max_num_batched_tokens=2048, enable_prefix_caching=False)
    params = [params_for(m) for m in wl.max_tokens]
    llm.generate(wl.prompts[:2], [params_for(4)] * 2)  # warm-up

    def static() -> None:  # a batch runs until its longest member ends; nobody joins mid-way
        for i in range(0, len(wl.prompts), seqs):
            longest = max(wl.max_tokens[i : i + seqs])
            group = wl.prompts[i : i + seqs]
            llm.generate(group, [params_for(longest)] * len(group))

    cont, stat = [], []
    for _ in range(repeats):
        cont.append(timed(lambda: llm.generate(wl.prompts, params)))
        stat.append(timed(static))
    return wl.total_output / min(cont), wl.total_output / min(stat)


def bench_hf(path: str, wl: Workload, seqs: int, repeats: int) -> float:
    """transformers `generate` tok/s (best of `repeats`): static batches, left padding,
    no early stop, only each request's own tokens counted."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    def run() -> None:
        for i in range(0, len(wl.prompts), seqs):
            group = wl.prompts[i : i + seqs]
            width = max(len(p) for p in group)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            with torch.no_grad():
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max(wl.max_tokens[i : i + seqs]),
                    do_sample=False,
                )

    return wl.total_output / min(timed(run) for _ in range(repeats))


def _generate_call(
    llm: LLM, prefix: list[int], suffix: list[int], params: SamplingParams, salt: str
) -> Callable[[], object]:
    """One timed request: the prompt is joined inside the call, as the request would be."""
    return lambda: llm.generate([prefix + suffix], params, cache_salt=salt)


def bench_prefix(path: str, prefix_len: int, repeats: int) -> tuple[float, float]:
    """(median TTFT cold, median TTFT with the prefix cached), seconds."""
    llm = LLM(path, max_num_seqs=8, max_num_batched_tokens=1024)
    rng = random.Random(1)
    prefix = [rng.randrange(3, 2000) for _ in range(prefix_len)]
    one = params_for(1)
    llm.generate([prefix[:64]], one)  # warm-up
    llm.generate([prefix + [5, 6]], one, cache_salt="warm")
    cold, warm = [], []
    for k in range(repeats):
        suffix = [rng.randrange(3, 2000) for _ in range(16)]
        cold.append(timed(_generate_call(llm, prefix, suffix, one, f"c{k}")))
        warm.append(timed(_generate_call(llm, prefix, suffix, one, "warm")))
    return statistics.median(cold), statistics.median(warm)


def p95(xs: list[float]) -> float:
    """95th percentile (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(0.95 * len(s)) - 1))]


def bench_itl(path: str, long_len: int, streams: int, chunked: bool, budget: int) -> float:
    """p95 ms between tokens of running streams while a `long_len`-token prompt arrives."""
    max_len = long_len + 64
    core = EngineCore(_config(path, chunked, budget if chunked else max_len, max_len, streams + 1))
    rng = random.Random(2)
    ids = [core.add_request([rng.randrange(3, 2000) for _ in range(32)], params_for(2500))
           for _ in range(streams)]  # fmt: skip
    stream_ids = {r.request_id for r in ids}
    last: dict[str, float] = {}
    for _ in range(4):  # the streams are decoding when the long prompt arrives
        core.step()
        now = time.perf_counter()
        last.update((rid, now) for rid in stream_ids)
    gaps: list[float] = []
    long = core.add_request([rng.randrange(3, 2000) for _ in range(long_len)], params_for(8))
    after_first = None
    while after_first is None or after_first < 4:
        deltas = core.step()
        now = time.perf_counter()
        for d in deltas:
            if d.request_id in stream_ids and d.new_token_ids:
                if d.request_id in last:
                    gaps.append(now - last[d.request_id])
                last[d.request_id] = now
        if long.num_output_tokens and after_first is None:
            after_first = 0
        elif after_first is not None:
            after_first += 1
    for rid in stream_ids:
        core.abort_request(rid)
    return p95(gaps) * 1000


def _config(path: str, chunked: bool, budget: int, max_len: int, seqs: int):  # noqa: ANN202
    from loraplex.platform.engine_spec.config import EngineConfig

    return EngineConfig(
        model=path,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_len,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=False,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the engine benchmarks and print RESULT lines."""
    p = argparse.ArgumentParser(prog="loraplex bench engine", description=__doc__)
    p.add_argument("--requests", type=int, default=48, help="requests in the throughput workload")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--prefix-len", type=int, default=2000)
    p.add_argument("--long-prompt", type=int, default=4000)
    p.add_argument("--chunk-budget", type=int, default=512)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2, help="best-of / median-of repeats")
    p.add_argument("--skip-hf", action="store_true", help="skip the transformers baseline")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: steadiest on a shared box; 0: as is)",
    )
    args = p.parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        results = run_all(args)
    finally:
        torch.set_num_threads(threads)
    for name, value in results.items():
        print(f"RESULT {name}={value:.2f}")
    return 0


def run_all(args: argparse.Namespace) -> dict[str, float]:
    """Every measurement, with progress; returns RESULT name -> value."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        task = progress.add_task("building tiny Llama", total=5)
        max_len = max(args.long_prompt, args.prefix_len) + 128
        vocab = save_bench_model(Path(tmp), args.layers, args.hidden, max_len)
        wl = make_workload(args.requests, vocab, seed=0)
        progress.update(task, advance=1, description="continuous vs static batching")
        cont, stat = bench_throughput(tmp, wl, args.max_num_seqs, args.repeats)
        results["engine.continuous_over_static"] = cont / stat
        console.print(f"continuous {cont:.0f} tok/s, static {stat:.0f} tok/s")
        progress.update(task, advance=1, description="transformers generate baseline")
        if args.skip_hf:
            console.print("transformers baseline skipped (--skip-hf)")
        else:
            hf = bench_hf(tmp, wl, args.max_num_seqs, args.repeats)
            results["engine.over_hf_generate"] = cont / hf
            console.print(f"transformers generate {hf:.0f} tok/s")
        progress.update(task, advance=1, description="prefix-cache TTFT")
        cold, warm = bench_prefix(tmp, args.prefix_len, args.repeats)
        results["engine.prefix_hit_ttft_speedup"] = cold / warm
        console.print(f"TTFT cold {cold * 1000:.1f} ms, cached prefix {warm * 1000:.1f} ms")
        progress.update(task, advance=1, description="ITL under a long prompt")
        results["engine.itl_p95_ms_chunked"] = bench_itl(
            tmp, args.long_prompt, args.streams, True, args.chunk_budget
        )
        results["engine.itl_p95_ms_unchunked"] = bench_itl(
            tmp, args.long_prompt, args.streams, False, args.chunk_budget
        )
        progress.update(task, advance=1, description="done")
    return results


if __name__ == "__main__":
    raise SystemExit(main())

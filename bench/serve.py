"""`loraplex bench serve`: Poisson arrivals over K adapters against a running stack.

Sends the same workload twice, side by side in one run: once spread uniformly over K of the
tenant's adapters (`serve.*`), once to their base model alone (`serve.base.*`, the baseline).
Each request is a streamed chat completion; per request we time TTFT (send -> first content
token) and the inter-token latencies (gaps between later content chunks). Goodput is the
share of requests whose TTFT and mean ITL both meet the targets given on the command line.

    loraplex bench serve --url http://127.0.0.1:8000 --api-key lp_... [--adapters a,b,c]
        [--replica-url http://10.0.0.5:8100]   # with LORAPLEX_REPLICA_SECRET set

With a replica to call directly, it also measures what the gateway adds per streamed chunk
over that replica, in the same run (`serve.gateway_overhead_ms_p50`, baseline
`serve.direct_chunk_ms_p50`; see `_gateway_overhead.py`).

Without `--url`, an in-process stack is started (embedded services, the demo model, one
replica, K uploaded random adapters): see `loraplex.bench.serve_stack`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.progress import Progress

from loraplex.bench.completion_client import WORDS, Outcome, one_request

console = Console(stderr=True)


@dataclass
class Spec:
    """One request of the workload: when it is sent, to which slot, with which prompt."""

    at: float
    slot: int
    prompt: str


def make_workload(n: int, rate: float, k: int, prompt_words: int, seed: int) -> list[Spec]:
    """`n` requests with exponential inter-arrival gaps (Poisson, `rate` per second)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        words = [rng.choice(WORDS) for _ in range(prompt_words)]
        out.append(Spec(t, rng.randrange(k), " ".join(words)))
    return out


async def run_workload(
    url: str, key: str, models: list[str], specs: list[Spec], max_tokens: int, label: str
) -> tuple[list[Outcome], float]:
    """Send every spec at its arrival time; returns outcomes and the wall time."""
    limits = httpx.Limits(max_connections=len(specs) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as http:
        t0 = time.perf_counter()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(label, total=len(specs))

            async def fire(spec: Spec) -> Outcome:
                await asyncio.sleep(max(0.0, spec.at - (time.perf_counter() - t0)))
                out = await one_request(
                    http, url, key, models[spec.slot % len(models)], spec.prompt, max_tokens
                )
                progress.advance(task)
                return out

            outcomes = await asyncio.gather(*(fire(s) for s in specs))
        return list(outcomes), time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank on the sorted values); NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def summarize(
    outcomes: list[Outcome], wall: float, ttft_ms: float, itl_ms: float
) -> dict[str, float]:
    """Latency percentiles, output tokens/s and goodput of one run."""
    ok = [o for o in outcomes if o.ok]
    ttfts = [o.ttft * 1000 for o in ok]
    itls = [x * 1000 for o in ok for x in o.itls]
    good = sum(
        1
        for o in ok
        if o.ttft * 1000 <= ttft_ms and (statistics.fmean(o.itls) * 1000 if o.itls else 0) <= itl_ms
    )
    return {
        "ttft_p50_ms": pct(ttfts, 50),
        "ttft_p95_ms": pct(ttfts, 95),
        "itl_p50_ms": pct(itls, 50),
        "itl_p95_ms": pct(itls, 95),
        "output_tps": sum(o.tokens for o in ok) / wall if wall > 0 else 0.0,
        "goodput": good / len(outcomes) if outcomes else 0.0,
        "errors": float(len(outcomes) - len(ok)),
    }


def discover(url: str, key: str, k: int, names: list[str] | None) -> tuple[list[str], str]:
    """The K adapters to use and their base model, from `/v1/models`."""
    resp = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    resp.raise_for_status()
    data = resp.json()["data"]
    adapters = {m["id"]: m.get("parent") for m in data if m.get("parent")}
    chosen = names or sorted(adapters)[:k]
    missing = [n for n in chosen if n not in adapters]
    if missing or not chosen:
        raise SystemExit(f"adapters not found for this key: {missing or 'none ready'}")
    bases = {adapters[n] for n in chosen}
    if len(bases) != 1:
        raise SystemExit(f"the adapters must share one base model, got {sorted(bases)}")
    return chosen, bases.pop()


def build_parser() -> argparse.ArgumentParser:
    """The `loraplex bench serve` command line."""
    p = argparse.ArgumentParser(
        prog="loraplex bench serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", help="API base URL (e.g. http://127.0.0.1:8000); none: in-process")
    p.add_argument("--api-key", help="tenant API key (required with --url)")
    p.add_argument("--adapters", help="comma-separated adapter names (default: the first K)")
    p.add_argument("--num-adapters", "-k", type=int, default=4)
    p.add_argument("--num-requests", "-n", type=int, default=48)
    p.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-words", type=int, default=48)
    p.add_argument("--ttft-target-ms", type=float, default=2000.0)
    p.add_argument("--itl-target-ms", type=float, default=200.0)
    p.add_argument("--warmup", type=int, default=4, help="requests sent before measuring")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--replica-url",
        help="a replica of the base model's deployment, called "
        "directly for the gateway-overhead baseline (secret: LORAPLEX_REPLICA_SECRET)",
    )
    p.add_argument("--overhead-runs", type=int, default=12, help="paired runs; 0 skips it")
    p.add_argument(
        "--first-request-runs",
        type=int,
        default=3,
        help="fresh adapters whose first request is timed against their warm ones (in-process "
        "stack only); 0 skips it",
    )
    return p


def run(
    url: str,
    key: str,
    args: argparse.Namespace,
    replica: tuple[str, str] | None = None,
    offline: Callable[[list[str], list[int], list[str] | None], float] | None = None,
    first_request: Callable[[str], dict[str, float]] | None = None,
    all_cores: Callable[[list[str], list[int]], float] | None = None,
) -> dict[str, dict[str, float]]:
    """Warm up, then the adapter workload and the base-model baseline; returns both summaries.

    With `replica` (its URL and secret), the gateway's per-chunk overhead over it as well; with
    `offline` (prompts, output tokens, each prompt's adapter name or None -> tokens/s of the
    same engine in-process), each run's served throughput over the engine's own
    (`serve.served_over_offline`, `serve.base.served_over_offline`); with
    `first_request` (base model -> figures), a new adapter's first request against its warm
    ones (`serve.first_over_warm_ttft`)."""
    names = [n for n in (args.adapters or "").split(",") if n] or None
    adapters, base = discover(url, key, args.num_adapters, names)
    console.print(f"adapters: {', '.join(adapters)} over base model {base}")
    specs = make_workload(args.num_requests, args.rate, len(adapters), args.prompt_words, args.seed)
    warm = make_workload(
        args.warmup, args.rate * 4, len(adapters), args.prompt_words, args.seed + 1
    )
    if warm:
        asyncio.run(run_workload(url, key, adapters + [base], warm, args.max_tokens, "warm-up"))
    results = {}
    for label, models in (("serve", adapters), ("serve.base", [base])):
        outcomes, wall = asyncio.run(run_workload(url, key, models, specs, args.max_tokens, label))
        results[label] = summarize(outcomes, wall, args.ttft_target_ms, args.itl_target_ms)
        errors = [o.error for o in outcomes if not o.ok]
        if errors:
            console.print(f"[yellow]{label}: {len(errors)} failed requests, e.g. {errors[0]}[/]")
        if offline is not None and not errors:
            names = [models[s.slot % len(models)] for s in specs] if label == "serve" else None
            with console.status("offline: the same engine and workload in-process…"):
                tps = offline([s.prompt for s in specs], [o.tokens for o in outcomes], names)
            results[label]["offline_output_tps"] = tps
            results[label]["served_over_offline"] = results[label]["output_tps"] / tps
            if label == "serve.base" and all_cores is not None:
                # The replica leaves a core to the API on a shared machine; the engine alone
                # on every core, for the record.
                with console.status("offline on every core…"):
                    every = all_cores([s.prompt for s in specs], [o.tokens for o in outcomes])
                results[label]["offline_all_cores_output_tps"] = every
                results[label]["served_over_offline_all_cores"] = (
                    results[label]["output_tps"] / every
                )
    if replica is not None and args.overhead_runs > 0:
        from loraplex.bench._gateway_overhead import measure

        with console.status("gateway overhead: gateway vs replica, paired runs…"):
            results["serve"].update(measure(url, key, base, *replica, runs=args.overhead_runs))
    if first_request is not None and args.first_request_runs > 0:
        with console.status("first requests of fresh adapters…"):
            results["serve"].update(first_request(base))
    return results


def print_results(results: dict[str, dict[str, float]]) -> None:
    """`RESULT name=value` lines (adapter run first, then the baseline)."""
    for label, summary in results.items():
        for name, value in summary.items():
            print(f"RESULT {label}.{name}={value:.4g}")


def main(argv: list[str]) -> int:
    """Entry point of `loraplex bench serve`."""
    args = build_parser().parse_args(argv)
    if args.url:
        if not args.api_key:
            raise SystemExit("--api-key is required with --url")
        secret = os.environ.get("LORAPLEX_REPLICA_SECRET")
        replica = None
        if args.replica_url:
            if not secret:
                raise SystemExit("--replica-url needs LORAPLEX_REPLICA_SECRET")
            replica = (args.replica_url.rstrip("/"), secret)
        print_results(run(args.url.rstrip("/"), args.api_key, args, replica))
        return 0
    from loraplex.bench._serve_offline import offline_output_tps
    from loraplex.bench.serve_stack import local_stack

    with local_stack(args.num_adapters) as info:
        url, key, replica_url, secret = info

        def offline(
            prompts: list[str], tokens: list[int], names: list[str] | None, every_core: bool = False
        ) -> float:
            # A fresh process: this one holds the stack's clients and threads (measured
            # here, the same engine ran at a fifth of its speed).
            folders = None if names is None else [str(info.adapter_dirs[n]) for n in names]
            config = info.engine_config
            if every_core:
                config = dataclasses.replace(config, cpu_threads=None)
            job = (config, info.model_dir, prompts, tokens, folders)
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                return float(pool.apply(offline_output_tps, job))

        def all_cores(prompts: list[str], tokens: list[int]) -> float:
            return offline(prompts, tokens, None, every_core=True)

        def first_request(base: str) -> dict[str, float]:
            from loraplex.bench._first_request import measure

            return measure(url, key, info.model_dir, base, args.first_request_runs)

        print_results(run(url, key, args, (replica_url, secret), offline, first_request, all_cores))
    return 0

"""`loraplex bench moe`: the grouped expert path and EPLB rebalancing, measured.

Prints, each against a baseline measured in the same run:

- moe.grouped_over_naive: time of the naive per-expert loop over the grouped CPU path
  (`fused_experts_torch` on the expert stacks as a CPU engine holds them: packed for oneDNN
  at load, `moe/packed_experts.py`; pairs sorted by expert, one matmul pair per active expert,
  each token's top-k rows then combined by one weighted gather-and-sum).
  The naive loop is the simple reference implementation: for each of the 64 experts, build the
  expert's mask over all tokens and run the expert over all tokens, weighting non-routed ones
  by zero. 64 experts, top-8, one prefill-sized batch (1024 tokens, hidden 768, expert width
  384), fp32, one CPU thread for every side.
- moe.grouped_over_masked_gather: the same against a smarter loop that gathers each expert's
  tokens with a mask scan per expert (transformers' eager path) on plain weights, at the
  prefill size; `..._decode` at a decode size (`--decode-tokens`, default 32 sequences);
  `..._bf16_decode` / `..._bf16` the same in bfloat16.
- moe.masked_gather_over_gemm_floor (`..._bf16`): the gather loop's prefill time over the
  time of its GEMMs alone (every expert's two matmuls on as many rows as it gets, nothing
  else): how much non-GEMM time any grouped path could still remove at that size. With GEMMs
  as fast as the loop's, no path beats the loop by more than this.
- moe.grouped_over_gemm_floor (`..._bf16`): the same GEMMs' time over the grouped path's:
  above 1 when the grouped path's packed GEMMs outrun the loop's plain ones by more than its
  own gathers and adds cost.

Times are this thread's CPU seconds by default (`--clock thread`, with `--threads 1`): on a
machine shared with other work, time spent descheduled is not the code's.
- moe.balancedness_before / moe.balancedness_after: mean / max routed pairs per rank over 8
  expert-parallel ranks for a skewed (Zipf-like) routing workload, under the default
  contiguous placement and under an EPLB placement with 8 redundant copies computed from a
  first window of traffic, both measured on a second, held-out window (pairs go to
  replicas exactly as the EP dispatcher sends them).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from loraplex.moe.eplb import balancedness, rebalance
from loraplex.moe.experts_torch import fused_experts_torch
from loraplex.moe.gating import softmax_topk
from loraplex.moe.packed_experts import PackedExperts, can_pack_experts
from loraplex.moe.placement import ExpertPlacement


def naive_per_expert(x, w13, w2, weights, ids) -> torch.Tensor:
    """Baseline: every expert scans all tokens' masks and runs over all tokens."""
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for e in range(w13.shape[0]):
        token_weight = (weights * (ids == e)).sum(dim=-1, keepdim=True)  # 0 if not routed
        gate_up = x @ w13[e].t()
        out += token_weight * ((F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].t())
    return out


def masked_gather_per_expert(x, w13, w2, weights, ids) -> torch.Tensor:
    """Informational baseline: per expert, scan the mask, gather its tokens, compute, add."""
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for e in range(w13.shape[0]):
        token_idx, k_idx = torch.where(ids == e)
        if token_idx.numel() == 0:
            continue
        gate_up = x[token_idx] @ w13[e].t()
        y = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].t()
        out.index_add_(0, token_idx, y * weights[token_idx, k_idx, None])
    return out


def _interleaved_medians(
    fns: dict[str, Callable[[], torch.Tensor]],
    reps: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds per function, the functions run in turn each rep (fair on a busy box)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(reps):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _routing_case(tokens: int, hidden: int, inter: int, dtype: torch.dtype) -> tuple:
    """Inputs, expert stacks and top-8 routing of 64 experts (same seed, any size)."""
    g = torch.Generator().manual_seed(0)
    experts, top_k = 64, 8
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    router = torch.randn(hidden, experts, generator=g)
    weights, ids = softmax_topk(x @ router, top_k, renormalize=True)
    return x.to(dtype), w13.to(dtype), w2.to(dtype), weights, ids


def _engine_stacks(w13: torch.Tensor, w2: torch.Tensor) -> tuple:
    """The expert stacks as a CPU engine holds them after loading (packed where it packs)."""
    if can_pack_experts(w13):
        return PackedExperts(w13), PackedExperts(w2)
    return w13, w2


def gemm_floor(x, w13, w2, ids) -> torch.Tensor:
    """Each active expert's two GEMMs on as many rows as it is routed, nothing else."""
    counts = torch.bincount(ids.reshape(-1), minlength=w13.shape[0]).tolist()
    act = x.new_zeros(max(counts), w2.shape[2])
    rows = x.new_zeros(max(counts), x.shape[1])
    for e, n in enumerate(counts):
        if n:
            torch.mm(rows[:n], w13[e].t())
            torch.mm(act[:n], w2[e].t())
    return act


def grouped_speedups(
    tokens: int,
    hidden: int,
    inter: int,
    reps: int,
    dtype: torch.dtype = torch.float32,
    naive: bool = True,
    floor: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Speedups of the grouped path over the per-expert loops (64 experts, top-8), and both
    paths against the gather loop's bare GEMMs (`floor`)."""
    x, w13, w2, weights, ids = _routing_case(tokens, hidden, inter, dtype)
    p13, p2 = _engine_stacks(w13, w2)
    grouped = fused_experts_torch(x, p13, p2, weights, ids).float()
    ref = masked_gather_per_expert(x.float(), w13.float(), w2.float(), weights, ids)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    if not torch.allclose(grouped, ref, atol=tol, rtol=tol):
        raise AssertionError("grouped path disagrees with the gather loop")
    fns = {
        "grouped": lambda: fused_experts_torch(x, p13, p2, weights, ids),
        "masked": lambda: masked_gather_per_expert(x, w13, w2, weights.to(dtype), ids),
    }
    if naive:
        fns["naive"] = lambda: naive_per_expert(x, w13, w2, weights.to(dtype), ids)
    if floor:
        fns["gemm"] = lambda: gemm_floor(x, w13, w2, ids)
    t = _interleaved_medians(fns, reps, clock)
    out = {"grouped_over_masked_gather": t["masked"] / t["grouped"]}
    if naive:
        out["grouped_over_naive"] = t["naive"] / t["grouped"]
    if floor:
        out["masked_gather_over_gemm_floor"] = t["masked"] / t["gemm"]
        out["grouped_over_gemm_floor"] = t["gemm"] / t["grouped"]
    return out


def skewed_routing(tokens: int, experts: int, top_k: int, seed: int) -> torch.Tensor:
    """Top-k expert ids whose popularity falls off like a power law (hot experts first)."""
    g = torch.Generator().manual_seed(seed)
    popularity = torch.arange(1, experts + 1, dtype=torch.float64) ** -1.1
    popularity = popularity[torch.randperm(experts, generator=torch.Generator().manual_seed(1))]
    logits = torch.randn(tokens, experts, generator=g, dtype=torch.float64) * 0.5
    logits = logits + popularity.log()
    # Gumbel top-k: sample k distinct experts per token in proportion to popularity.
    gumbel = -torch.log(-torch.log(torch.rand(tokens, experts, generator=g, dtype=torch.float64)))
    return torch.topk(logits + gumbel, top_k, dim=-1).indices


def balancedness_results(world_size: int, redundant: int, tokens: int) -> dict[str, float]:
    """Balancedness of contiguous vs EPLB placement on held-out skewed traffic."""
    experts, top_k = 64, 8
    window = skewed_routing(tokens, experts, top_k, seed=10)
    held_out = skewed_routing(tokens, experts, top_k, seed=11)
    load = torch.bincount(window.reshape(-1), minlength=experts)
    before = ExpertPlacement.contiguous(experts, world_size)
    after = rebalance(load, world_size, num_redundant=redundant)
    return {
        "moe.balancedness_before": balancedness(before.pairs_per_rank(held_out)),
        "moe.balancedness_after": balancedness(after.pairs_per_rank(held_out)),
    }


def main(argv: list[str]) -> int:
    """Run the MoE benchmarks and print RESULT lines."""
    parser = argparse.ArgumentParser(prog="loraplex bench moe", description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1024, help="tokens in the expert batch")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--inter", type=int, default=384, help="expert intermediate size")
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens of a decode step")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: stable on a shared box)"
    )
    parser.add_argument(
        "--clock", choices=("thread", "wall"), default="thread",
        help="thread: this thread's CPU seconds (one thread only; time spent descheduled on "
        "a busy machine is not counted), wall: elapsed seconds",
    )  # fmt: skip
    parser.add_argument("--ranks", type=int, default=8, help="simulated EP ranks")
    parser.add_argument("--redundant", type=int, default=8, help="redundant expert copies")
    parser.add_argument("--route-tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread measures one thread: use --threads 1 or --clock wall")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter

    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    results: dict[str, float] = {}
    with Progress(console=console) as progress:
        task = progress.add_task("grouped vs per-expert loops", total=2)
        sizes = (args.hidden, args.inter, args.reps)
        for name, value in grouped_speedups(args.tokens, *sizes, clock=clock).items():
            results[f"moe.{name}"] = value
        for suffix, tokens, dtype in (
            ("_decode", args.decode_tokens, torch.float32),
            ("_bf16", args.tokens, torch.bfloat16),
            ("_bf16_decode", args.decode_tokens, torch.bfloat16),
        ):
            if dtype == torch.bfloat16 and not can_pack_experts(torch.empty(1, 1, 1, dtype=dtype)):
                continue  # no native bf16 here: the engine would not run bf16 experts on it
            prefill = tokens == args.tokens
            speedup = grouped_speedups(
                tokens, *sizes, dtype=dtype, naive=False, floor=prefill, clock=clock
            )
            for name, value in speedup.items():
                results[f"moe.{name}{suffix}"] = value
        progress.update(task, advance=1, description="balancedness before/after rebalance")
        results.update(balancedness_results(args.ranks, args.redundant, args.route_tokens))
        progress.update(task, advance=1)
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}")
    return 0

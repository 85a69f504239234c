"""`loraplex bench determinism`: what the deterministic mode costs, and what it buys.

On the demo model (`--dtype`, default auto), two engines, the mode on and off, run in lockstep over the same
work (one step of each in turn, each timed on its own steps; the median of `--repeats` passes):
- determinism.decode_b1_ratio, determinism.decode_b32_ratio: decode tok/s with the mode over
  without, one request and `--batch` (32) requests of `--max-tokens` tokens (target for b32:
  at least 0.85);
- determinism.prefill_ratio: prefill tok/s likewise (`--batch` prompts of `--prompt-len`
  tokens, one output token each).
- determinism.distinct_outputs_on / _off: the number of distinct (tokens, logprobs) answers
  over `--identical` identical requests sent to one engine a few per step, so each meets
  another batch and other chunk boundaries (target 1 with the mode);
- determinism.gateway_distinct_on / _off: the same count over `--gateway-requests` (1,000)
  identical chat completions sent at once through the gateway of a fresh local platform
  (`_determinism_gateway.py`) whose deployment has the deterministic option on, then off
  (target 1 with it; 0 requests skips this part); determinism.gateway_refused_on / _off and
  _dropped_on / _off: sends repeated after a 429/503, or after the connection dropped.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from loraplex.bench.lockstep import lockstep_times


def _engines(model: Path, dtype: str) -> dict[str, Any]:
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine_spec.config import EngineConfig

    common = dict(model=str(model), dtype=dtype, max_loras=0, enable_prefix_caching=False)
    return {
        "off": EngineCore(EngineConfig(**common)),  # type: ignore[arg-type]
        "on": EngineCore(EngineConfig(**common, deterministic=True)),  # type: ignore[arg-type]
    }


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 200, (length,), generator=g).tolist() for _ in range(n)]


def ratios(engines: dict[str, Any], batch: int, prompt_len: int, max_tokens: int,
           repeats: int) -> dict[str, float]:  # fmt: skip
    """Median over passes of each workload's on-over-off throughput ratio (lockstep)."""
    from loraplex.platform.engine.sampling_params import SamplingParams

    decode = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    prefill = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    work = {
        "decode_b1": (_prompts(1, 8, 1), decode, max_tokens),
        f"decode_b{batch}": (_prompts(batch, 8, 2), decode, batch * max_tokens),
        "prefill": (_prompts(batch, prompt_len, 3), prefill, batch),
    }
    out: dict[str, float] = {}
    for name, (prompts, params, tokens) in work.items():
        passes = []
        for _ in range(repeats):
            adapters = {k: [None] * len(prompts) for k in engines}
            t = lockstep_times(engines, prompts, adapters, params, tokens)
            passes.append(t["off"] / t["on"])  # throughput on over off
        out[f"determinism.{name}_ratio"] = statistics.median(passes)
    return out


def distinct_outputs(engine: Any, identical: int, per_step: int, max_tokens: int) -> int:  # noqa: ANN401
    """Distinct (tokens, logprobs) answers to `identical` copies of one request, `per_step`
    joining each step (so every copy meets another batch)."""
    from loraplex.platform.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=2, ignore_eos=True)
    prompt = _prompts(1, 40, 9)[0]
    pending = [f"same-{i}" for i in range(identical)]
    answers: dict[str, tuple[list[int], list[Any]]] = {}
    while pending or engine.has_unfinished():
        for rid in pending[:per_step]:
            engine.add_request(prompt, params, rid)
        pending = pending[per_step:]
        for d in engine.step():
            tokens, lps = answers.setdefault(d.request_id, ([], []))
            tokens.extend(d.new_token_ids)
            lps.extend(d.new_logprobs)
    return len({(tuple(t), repr(lp)) for t, lp in answers.values()})


def main(argv: list[str] | None = None) -> int:
    """Print the RESULT lines of the module docstring."""
    from loraplex.platform.demo_model import make_demo_model

    ap = argparse.ArgumentParser(prog="loraplex bench determinism",
                                 description=__doc__.split("\n")[0])  # fmt: skip
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--identical", type=int, default=200, help="copies of the one request")
    ap.add_argument("--per-step", type=int, default=3, help="copies joining each step")
    ap.add_argument("--dtype", default="auto", help="compute dtype of both engines")
    ap.add_argument(
        "--gateway-requests",
        type=int,
        default=None,
        help="identical requests sent at once through the platform (default 1000; --quick: "
        "0; 0 skips)",
    )
    ap.add_argument("--gateway-tokens", type=int, default=16, help="max_tokens of each")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch (and kernel) threads of both engines; default torch's own",
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the test's smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.prompt_len, args.max_tokens, args.repeats = 4, 16, 4, 1
        args.identical, args.per_step = 12, 3
    if args.gateway_requests is None:
        args.gateway_requests = 0 if args.quick else 1000
    if args.threads is not None:  # process-wide: both engines alike
        import torch

        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as name:
        engines = _engines(make_demo_model(Path(name) / "demo"), args.dtype)
        results = ratios(engines, args.batch, args.prompt_len, args.max_tokens, args.repeats)
        for mode, engine in engines.items():
            count = distinct_outputs(engine, args.identical, args.per_step, args.max_tokens)
            results[f"determinism.distinct_outputs_{mode}"] = count
    if args.gateway_requests:
        from loraplex.bench._determinism_gateway import gateway_distinct_outputs

        for mode, on in (("on", True), ("off", False)):
            count, resent = gateway_distinct_outputs(on, args.gateway_requests, args.gateway_tokens)
            results[f"determinism.gateway_distinct_{mode}"] = count
            for why, n in resent.items():
                results[f"determinism.gateway_{why}_{mode}"] = n
        results["determinism.gateway_requests"] = args.gateway_requests
    for key, value in results.items():
        print(f"RESULT {key}={value:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

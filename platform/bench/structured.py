"""`loraplex bench structured`: what structured outputs cost on this machine.

- structured.constrained_over_free: decode tok/s of a batch of `--batch` (32) requests, every
  one JSON-schema constrained (the fifty test schemas in turn), over the same requests
  unconstrained with the same output lengths, on the demo model, measured side by side in one
  engine (pairs alternate; the median pair ratio). Target: at least 0.9.
- structured.mask_us_per_token: the grammar bitmask's time per sequence per step at a
  `--vocab` (128k) vocabulary, `--batch` matchers filled together as the engine does
  (llguidance's executor on a worker thread), with structured.mask_over_decode_token: that time
  over the unconstrained decode time per token above.
- structured.first_compile_ms / cached_compile_ms: a JSON schema's first request at that
  vocabulary (compile and first mask) and the second one's (a copy of the cached matcher and
  its first mask), and their ratio.
- structured.xgrammar_mask_us_per_token and structured.llguidance_over_xgrammar_mask, when
  xgrammar is importable: the same mask walk with the other library (how llguidance was chosen).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _engine(model: Path, batch: int) -> Any:
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine_spec.config import EngineConfig

    return EngineCore(EngineConfig(model=str(model), max_num_seqs=batch, max_model_len=1024,
                                   max_num_batched_tokens=4096))  # fmt: skip


def _run(core: Any, prompts: list[str], params: list[Any]) -> tuple[list[int], float]:
    """Run requests to the end; (output lengths, seconds)."""
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        core.add_request(p, sp, f"r{time.monotonic_ns()}-{i}")
    lengths: dict[str, int] = {}
    start = time.perf_counter()
    while core.has_unfinished():
        for d in core.step():
            lengths[d.request_id] = lengths.get(d.request_id, 0) + len(d.new_token_ids)
    seconds = time.perf_counter() - start
    return [lengths[k] for k in sorted(lengths, key=lambda k: int(k.rsplit("-", 1)[1]))], seconds


def throughput(
    model: Path, batch: int, requests: int, repeats: int, max_tokens: int
) -> dict[str, float]:
    """Constrained vs free decode tok/s at `batch` (see the module docstring)."""
    from loraplex.platform.engine.sampling_params import SamplingParams
    from loraplex.platform.engine.structured import GrammarSpec
    from loraplex.platform.testing.json_schemas import json_schemas

    schemas = json_schemas()
    core = _engine(model, batch)
    prompts = [f"record {i}: " for i in range(requests)]

    def constrained(seed: int) -> list[Any]:
        return [SamplingParams(temperature=1.0, seed=seed + i, max_tokens=max_tokens,
                               structured=GrammarSpec("json_schema",
                                                      json.dumps(schemas[i % len(schemas)])))
                for i in range(requests)]  # fmt: skip

    _run(core, prompts, constrained(10_000))  # warm-up: every schema compiled once
    ratios, con_rates, free_rates = [], [], []
    for r in range(repeats):
        lengths, con_s = _run(core, prompts, constrained(r * requests))
        free = [SamplingParams(temperature=1.0, seed=r * requests + i, max_tokens=n,
                               ignore_eos=True) for i, n in enumerate(lengths)]  # fmt: skip
        free_lengths, free_s = _run(core, prompts, free)
        assert free_lengths == lengths, "the free run must generate the same token counts"
        con_rates.append(sum(lengths) / con_s)
        free_rates.append(sum(lengths) / free_s)
        ratios.append(con_rates[-1] / free_rates[-1])
        print(f"pass {r}: {sum(lengths)} tokens, constrained {con_rates[-1]:.0f} tok/s, "
              f"free {free_rates[-1]:.0f} tok/s")  # fmt: skip
    return {
        "structured.constrained_tok_s": statistics.median(con_rates),
        "structured.free_tok_s": statistics.median(free_rates),
        "structured.constrained_over_free": statistics.median(ratios),
        "structured.free_us_per_token": 1e6 / statistics.median(free_rates),
    }


def _allowed(mask_row: Any, vocab: int) -> list[int]:
    import torch

    bits = ((mask_row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(-1)[:vocab]
    return bits.nonzero().view(-1).tolist()


def mask_and_compile(vocab: int, batch: int, steps: int) -> dict[str, float]:
    """llguidance at a `vocab` vocabulary: compile times and the batched mask time per token."""
    from loraplex.platform.bench._vocab128k import tokenizer_json
    from loraplex.platform.engine.structured import GrammarSpec
    from loraplex.platform.engine.structured.bitmask import MaskFiller
    from loraplex.platform.engine.structured.compiler import GrammarCompiler
    from loraplex.platform.testing.json_schemas import json_schemas

    text, eos = tokenizer_json(vocab)
    width = vocab + 1
    compiler = GrammarCompiler(text, width, [eos])
    t0 = time.perf_counter()
    compiler._tokenizer()
    tokenizer_s = time.perf_counter() - t0
    schemas = [GrammarSpec("json_schema", json.dumps(s)) for s in json_schemas()]
    filler = MaskFiller(width)

    def to_first_mask(spec: GrammarSpec) -> float:
        """Compile (or copy) and fill the first mask: llguidance builds lexer states lazily."""
        t0 = time.perf_counter()
        filler.start([compiler.state_for(spec)])
        filler.join()
        return time.perf_counter() - t0

    first, cached = [], []
    for spec in schemas[:10]:
        first.append(to_first_mask(spec))
        cached.append(to_first_mask(spec))
    for spec in schemas:  # warm the cache for the walk
        compiler.state_for(spec)
    rng = random.Random(0)
    states = [compiler.state_for(schemas[i % len(schemas)]) for i in range(batch)]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        filler.start(states)
        mask = filler.join()
        times.append((time.perf_counter() - t0) / batch)
        for i, state in enumerate(states):
            choice = rng.choice(_allowed(mask[i], width))
            if choice == eos or state.is_finished:
                states[i] = compiler.state_for(schemas[rng.randrange(len(schemas))])
            else:
                state.accept(choice)
    return {
        "structured.tokenizer_build_ms": tokenizer_s * 1e3,
        "structured.first_compile_ms": statistics.median(first) * 1e3,
        "structured.cached_compile_ms": statistics.median(cached) * 1e3,
        "structured.cached_over_first_compile": statistics.median(cached)
        / statistics.median(first),
        "structured.mask_us_per_token": statistics.median(times) * 1e6,
    }


def xgrammar_mask(vocab: int, steps: int) -> dict[str, float]:
    """The same single-matcher random walk with xgrammar (empty when it is not installed)."""
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar not installed: no library comparison")
        return {}
    from loraplex.platform.bench._vocab128k import vocab_tokens
    from loraplex.platform.testing.json_schemas import json_schemas

    tokens = [*vocab_tokens(vocab), "</s>"]
    eos = len(tokens) - 1
    info = xgr.TokenizerInfo(tokens, vocab_type=xgr.VocabType.BYTE_LEVEL, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info)
    compiled = [compiler.compile_json_schema(json.dumps(s), any_whitespace=False)
                for s in json_schemas()]  # fmt: skip
    rng = random.Random(0)
    matcher = xgr.GrammarMatcher(compiled[0])
    mask = xgr.allocate_token_bitmask(1, len(tokens))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - t0)
        choice = rng.choice(_allowed(mask[0], len(tokens)))
        if choice == eos or matcher.is_terminated():
            matcher = xgr.GrammarMatcher(compiled[rng.randrange(len(compiled))])
        else:
            matcher.accept_token(choice)
    return {"structured.xgrammar_mask_us_per_token": statistics.median(times) * 1e6}


def llguidance_single(vocab: int, steps: int) -> float:
    """The single-matcher walk with llguidance (the comparison's other side), in us."""
    from loraplex.platform.bench._vocab128k import tokenizer_json
    from loraplex.platform.engine.structured import GrammarSpec
    from loraplex.platform.engine.structured.compiler import GrammarCompiler
    from loraplex.platform.testing.json_schemas import json_schemas

    text, eos = tokenizer_json(vocab)
    compiler = GrammarCompiler(text, vocab + 1, [eos])
    schemas = [GrammarSpec("json_schema", json.dumps(s)) for s in json_schemas()]
    rng = random.Random(0)
    state = compiler.state_for(schemas[0])
    import torch

    mask = torch.zeros(1, (vocab + 32) // 32, dtype=torch.int32)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state.matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        times.append(time.perf_counter() - t0)
        choice = rng.choice(_allowed(mask[0], vocab + 1))
        if choice == eos or state.is_finished:
            state = compiler.state_for(schemas[rng.randrange(len(schemas))])
        else:
            state.accept(choice)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    """Print the RESULT lines of the module docstring."""
    from loraplex.platform.demo_model import make_demo_model

    ap = argparse.ArgumentParser(prog="loraplex bench structured",
                                 description=__doc__.split("\n")[0])  # fmt: skip
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64, help="requests per timed pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=128_000, help="vocabulary of the mask timing")
    ap.add_argument("--steps", type=int, default=200, help="mask steps timed")
    ap.add_argument("--max-tokens", type=int, default=400, help="per constrained request")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the test's smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.requests, args.repeats, args.vocab, args.steps = 2, 2, 1, 4000, 10
        args.max_tokens = 12
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as name:
        model = make_demo_model(Path(name) / "demo")
        results.update(throughput(model, args.batch, args.requests, args.repeats, args.max_tokens))
    results.update(mask_and_compile(args.vocab, args.batch, args.steps))
    results["structured.mask_over_decode_token"] = (
        results["structured.mask_us_per_token"] / results["structured.free_us_per_token"]
    )
    xgr = xgrammar_mask(args.vocab, args.steps)
    if xgr:
        results.update(xgr)
        single = llguidance_single(args.vocab, args.steps)
        results["structured.llguidance_single_mask_us"] = single
        results["structured.llguidance_over_xgrammar_mask"] = (
            single / xgr["structured.xgrammar_mask_us_per_token"]
        )
    for key, value in results.items():
        print(f"RESULT {key}={value:.4g}")
    return 0

"""`loraplex bench structured`: what structured outputs cost on this machine.

- structured.constrained_over_free: decode tok/s of a batch of `--batch` (32) requests, every
  one JSON-schema constrained (the fifty test schemas in turn), over the same requests
  unconstrained with the same output lengths, on the demo model: two engines run in lockstep
  (one step of each in turn, each timed on its own steps; the median of `--repeats` passes).
  Target: at least 0.9.
- structured.mask_us_per_token: the grammar bitmask's time per sequence per step at a
  `--vocab` (128k) vocabulary, `--batch` matchers filled together as the engine does
  (llguidance's executor on a worker thread), with structured.mask_over_decode_token: that time
  over the unconstrained decode time per token above.
- structured.first_compile_ms / cached_compile_ms: a JSON schema's first request at that
  vocabulary (compile and first mask) and the second one's (a copy of the cached matcher and
  its first mask), and their ratio.
- structured.{llguidance,xgrammar}_mask_{median,p90,mean}_us, their compile times and
  structured.llguidance_over_xgrammar_mean_mask, when xgrammar is importable: one matcher's mask
  time over the same token sequences with each library (how the library was chosen).
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


def _run(core: Any, prompts: list[str], params: list[Any]) -> list[int]:
    """Run requests to the end (untimed); their output lengths in order."""
    lengths, _ = _lockstep({"one": core}, {"one": list(zip(prompts, params, strict=True))})
    return lengths["one"]


def _lockstep(
    engines: dict[str, Any], work: dict[str, list[tuple[str, Any]]]
) -> tuple[dict[str, list[int]], dict[str, float]]:
    """Each engine serves its own (prompt, params) list, one step of each engine in turn (the
    order rotating each round), so a slow stretch of this shared machine lands on both alike;
    returns each engine's output lengths and the seconds spent in its own steps."""
    ids: dict[str, list[str]] = {}
    for name, engine in engines.items():
        ids[name] = [f"{name}-{time.monotonic_ns()}-{i}" for i in range(len(work[name]))]
        for rid, (prompt, params) in zip(ids[name], work[name], strict=True):
            engine.add_request(prompt, params, rid)
    counts: dict[str, int] = {}
    spent = dict.fromkeys(engines, 0.0)
    active = list(engines)
    rnd = 0
    while active:
        shift = rnd % len(active)
        for name in active[shift:] + active[:shift]:
            t0 = time.perf_counter()
            deltas = engines[name].step()
            spent[name] += time.perf_counter() - t0
            for d in deltas:
                counts[d.request_id] = counts.get(d.request_id, 0) + len(d.new_token_ids)
        active = [n for n in active if engines[n].has_unfinished()]
        rnd += 1
    return {n: [counts.get(r, 0) for r in ids[n]] for n in engines}, spent


def throughput(
    model: Path, batch: int, requests: int, repeats: int, max_tokens: int
) -> dict[str, float]:
    """Constrained vs free decode tok/s at `batch` (see the module docstring): two engines of
    the demo model in lockstep, the free requests as long as the constrained ones were."""
    from loraplex.bench._synthetic.json_schemas import json_schemas
    from loraplex.platform.engine.sampling_params import SamplingParams
    from loraplex.platform.engine.structured import GrammarSpec

    schemas = json_schemas()
    engines = {"constrained": _engine(model, batch), "free": _engine(model, batch)}
    prompts = [f"record {i}: " for i in range(requests)]
    constrained = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens,
                       structured=GrammarSpec("json_schema", json.dumps(schemas[i % len(schemas)])))
        for i in range(requests)
    ]  # fmt: skip
    lengths = _run(engines["constrained"], prompts, constrained)  # also compiles every grammar
    free = [SamplingParams(temperature=1.0, seed=i, max_tokens=n, ignore_eos=True)
            for i, n in enumerate(lengths)]  # fmt: skip
    _run(engines["free"], prompts, free)  # warm-up
    work = {"constrained": list(zip(prompts, constrained, strict=True)),
            "free": list(zip(prompts, free, strict=True))}  # fmt: skip
    ratios, con_rates, free_rates = [], [], []
    for r in range(repeats):
        got, spent = _lockstep(engines, work)
        if got["constrained"] != lengths or got["free"] != lengths:
            raise RuntimeError("the passes must generate the same token counts")
        con_rates.append(sum(lengths) / spent["constrained"])
        free_rates.append(sum(lengths) / spent["free"])
        ratios.append(spent["free"] / spent["constrained"])
        print(f"pass {r}: {sum(lengths)} tokens each, constrained {con_rates[-1]:.0f} tok/s, "
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
    from loraplex.bench._synthetic.json_schemas import json_schemas
    from loraplex.bench._vocab128k import tokenizer_json
    from loraplex.platform.engine.structured import GrammarSpec
    from loraplex.platform.engine.structured.bitmask import MaskFiller
    from loraplex.platform.engine.structured.compiler import GrammarCompiler

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
        assert mask is not None  # every row is constrained
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


def _stats(prefix: str, times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        f"{prefix}_median_us": statistics.median(times) * 1e6,
        f"{prefix}_p90_us": times[int(0.9 * (len(times) - 1))] * 1e6,
        f"{prefix}_mean_us": statistics.fmean(times) * 1e6,
    }


def library_comparison(vocab: int, steps: int) -> dict[str, float]:
    """One matcher's mask time, llguidance vs xgrammar, over the same token sequences: random
    walks through the fifty schemas made with llguidance, replayed with xgrammar (a walk stops
    where the other library refuses a token). Empty when xgrammar is not installed."""
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar not installed: no library comparison")
        return {}
    import torch
    from llguidance import LLMatcher, LLTokenizer

    from loraplex.bench._synthetic.json_schemas import json_schemas
    from loraplex.bench._vocab128k import tokenizer_json, vocab_tokens
    from loraplex.platform.wire.grammar import grammar_text

    schemas = [json.dumps(s) for s in json_schemas()]
    text, eos = tokenizer_json(vocab)
    lltok = LLTokenizer(text, n_vocab=vocab + 1, eos_token=eos)
    t0 = time.perf_counter()
    protos = [LLMatcher(lltok, grammar_text("json_schema", s), log_level=0) for s in schemas]
    llg_compile = (time.perf_counter() - t0) / len(schemas)
    rng = random.Random(0)
    mask = torch.zeros(1, (vocab + 32) // 32, dtype=torch.int32)
    walks: list[tuple[int, list[int]]] = []
    llg_times: list[float] = []
    while len(llg_times) < steps:
        idx = rng.randrange(len(schemas))
        m, tokens = protos[idx].deep_copy(), []
        while len(llg_times) < steps:
            t1 = time.perf_counter()
            m.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
            llg_times.append(time.perf_counter() - t1)
            choice = rng.choice(_allowed(mask[0], vocab + 1))
            if choice == eos or m.is_stopped():
                break
            m.consume_token(choice)
            tokens.append(choice)
        walks.append((idx, tokens))
    info = xgr.TokenizerInfo([*vocab_tokens(vocab), "</s>"], vocab_type=xgr.VocabType.BYTE_LEVEL,
                             stop_token_ids=[eos])  # fmt: skip
    compiler = xgr.GrammarCompiler(info)
    t0 = time.perf_counter()
    compiled = [compiler.compile_json_schema(s, any_whitespace=False) for s in schemas]
    xgr_compile = (time.perf_counter() - t0) / len(schemas)
    xmask = xgr.allocate_token_bitmask(1, vocab + 1)
    xgr_times: list[float] = []
    for idx, tokens in walks:
        matcher = xgr.GrammarMatcher(compiled[idx])
        for token in tokens:
            t1 = time.perf_counter()
            matcher.fill_next_token_bitmask(xmask)
            xgr_times.append(time.perf_counter() - t1)
            if not matcher.accept_token(token):
                break
    out = {"structured.llguidance_compile_ms": llg_compile * 1e3,
           "structured.xgrammar_compile_ms": xgr_compile * 1e3}  # fmt: skip
    out.update(_stats("structured.llguidance_mask", llg_times))
    out.update(_stats("structured.xgrammar_mask", xgr_times))
    out["structured.llguidance_over_xgrammar_mean_mask"] = (
        out["structured.llguidance_mask_mean_us"] / out["structured.xgrammar_mask_mean_us"]
    )
    return out


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
    results.update(library_comparison(args.vocab, args.steps))
    for key, value in results.items():
        print(f"RESULT {key}={value:.4g}")
    return 0

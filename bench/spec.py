"""`loraplex bench spec`: what n-gram speculative decoding buys, against no speculation in the
same run.

Two engines over one random Llama (`--hidden` 512, `--layers` 4, vocab 4096, bf16 where the CPU
computes it natively), speculation off and on (`SpecConfig()`: prompt lookup plus adapter
suffix tables, K chosen per request per step by the controller), run in lockstep
(`lockstep.py`: one step of each in turn, each timed on its own steps) on the same prompts and
output lengths. Both engines run one CPU thread: on this shared 2-core machine, two threads of
small GEMMs wait on each other for tens of milliseconds whenever another process holds a core.
Each step is timed in the CPU time of the thread that runs it (which with one thread runs the
whole forward), so the time another process holds the core is not counted against either.

- spec.ngram_b1_speedup: decode throughput at batch 1 (the decode steps' time: the prompts'
  prefill steps, the same work for both engines, left out), greedy, over no speculation; target
  at least 1.8. spec.ngram_b1_e2e_speedup: the same over every step, prefill included. The
  workload is copy-heavy: a random model's greedy output settles into repeating itself, so
  prompt lookup over the request's own tokens finds what comes next
  (spec.ngram_b1_mean_acceptance_length: tokens per verification).
- spec.b{32,64}_speedup: the same greedy workload at batch 32 and 64 (`--waves` x batch
  requests queued, at most batch running: a steady batch rather than one closed batch whose
  early finishers leave a ragged tail); target at least 0.98.
- spec.b{32,64}_sampled_speedup: temperature 1, where drafts are mostly wrong, so the
  controller must stop drafting; target at least 0.98 (never slower).
- spec.b*_draft_share: the share of sequence-steps that drafted.

Each batch figure is the median of `--repeats` runs (fresh engines each), every run logged: at
a draft share near 0 the two engines differ by well under 1%, less than one run's noise here.

With `--draft` (the default), the draft-model figures on trained tiny models (`spec_draft.py`):
spec.heavy_shift_al_gain (target at least 1.3), spec.mild_al_gain, the acceptance length per
adapter with the plain draft and with its draft adapter, spec.draft_model_b1_speedup and
spec.draft_adapter_b1_speedup. The trained models are cached in `--cache-dir` (default: bench
quant's, whose target it shares).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from loraplex.bench.lockstep import lockstep_times


def _log(msg: str) -> None:
    print(f"[bench spec] {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(prog="loraplex bench spec", description=__doc__)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--b1-prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--batches", default="32,64", help="comma-separated; empty: batch 1 only")
    p.add_argument("--k-max", type=int, default=None, help="default: SpecConfig's")
    p.add_argument("--waves", type=int, default=3, help="requests per batch slot (queued)")
    p.add_argument("--repeats", type=int, default=3, help="runs per batch figure (median)")
    p.add_argument("--draft", action=argparse.BooleanOptionalAction, default=True,
                   help="the draft-model figures on trained tiny models")  # fmt: skip
    p.add_argument("--cache-dir", type=Path, default=None, help="default: <data dir>/bench-quant")
    p.add_argument("--train-steps", type=int, default=1200, help="the target's training steps")
    p.add_argument("--draft-steps", type=int, default=600, help="the draft's training steps")
    p.add_argument("--lora-steps", type=int, default=150, help="each adapter's training steps")
    p.add_argument("--al-prompts", type=int, default=3, help="prompts per adapter")
    p.add_argument("--al-prompt-tokens", type=int, default=128)
    p.add_argument("--al-tokens", type=int, default=64, help="output tokens per prompt")
    p.add_argument("--quick", action="store_true", help="a seconds-long run (for tests)")
    return p


def build_model(path: Path, hidden: int, layers: int, vocab: int) -> None:
    """Save the random target to `path`."""
    from loraplex.bench._synthetic.models import save_random_model

    save_random_model(
        path, "llama", seed=0, init="hf", tiny=False, with_tokenizer=False,
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 256), max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def _engines(path: Path, batch: int, k_max: int | None) -> dict[str, Any]:
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.speculative import SpecConfig
    from loraplex.platform.engine_spec.config import EngineConfig

    def core() -> Any:  # noqa: ANN401
        return EngineCore(EngineConfig(model=str(path), max_num_seqs=max(batch, 1),
                                       max_model_len=1024, max_num_batched_tokens=4096,
                                       cpu_threads=1))  # fmt: skip

    off, on = core(), core()
    on.enable_speculation(SpecConfig() if k_max is None else SpecConfig(k_max=k_max))
    return {"off": off, "on": on}


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Random token prompts."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(count)]


class DecodeTimed:
    """An engine whose decode steps (every scheduled request runs its next token: no prompt
    chunk in the step) are also timed on their own, in thread CPU time."""

    def __init__(self, engine: Any) -> None:  # noqa: ANN401 - an EngineCore
        self.engine = engine
        self.decode_s = 0.0

    def add_request(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        return self.engine.add_request(*args, **kwargs)

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished())

    def step(self) -> list[Any]:
        t0 = time.thread_time()
        deltas = self.engine.step()
        seconds = time.thread_time() - t0
        if deltas and self.engine.last_num_scheduled_tokens == len(deltas):
            self.decode_s += seconds
        return deltas


def speedup(
    path: Path, work: list[list[int]], batch: int, params: Any, k_max: int | None = None
) -> tuple[float, float, float, float]:
    """(throughput with speculation over without, the same over decode steps only, mean
    acceptance length, draft share) on `work`, at most `batch` requests running at once (the
    rest queued: a steady batch)."""
    engines = _engines(path, batch, k_max)
    timed = {k: DecodeTimed(e) for k, e in engines.items()}
    refs = {k: [None] * len(work) for k in engines}
    spent = lockstep_times(
        timed, work, refs, params, params.max_tokens * len(work), clock=time.thread_time
    )
    stats = engines["on"].speculator.stats.get(None)
    length = 0.0 if stats is None else stats.mean_acceptance_length
    drafted = 0 if stats is None else stats.verifications
    decode = timed["off"].decode_s / timed["on"].decode_s
    return spent["off"] / spent["on"], decode, length, drafted / (len(work) * params.max_tokens)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print RESULT lines."""
    from loraplex.platform.engine.sampling_params import SamplingParams

    args = build_parser().parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.vocab, args.b1_prompts = 64, 1, 256, 1
        args.prompt_tokens, args.tokens, args.batches, args.waves = 32, 16, "4", 2
        args.train_steps = args.draft_steps = args.lora_steps = 2
        args.repeats = 1
        args.al_prompts, args.al_prompt_tokens, args.al_tokens = 1, 32, 8
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build_model(path, args.hidden, args.layers, args.vocab)
        work = prompts(args.b1_prompts, args.prompt_tokens, args.vocab, 0)
        ratio, decode, length, share = speedup(path, work, 1, greedy, args.k_max)
        print(f"RESULT spec.ngram_b1_speedup={decode:.4f}")
        print(f"RESULT spec.ngram_b1_e2e_speedup={ratio:.4f}")
        print(f"RESULT spec.ngram_b1_mean_acceptance_length={length:.4f}")
        print(f"RESULT spec.b1_draft_share={share:.4f}")
        for batch in [int(b) for b in args.batches.split(",") if b]:
            work = prompts(batch * args.waves, args.prompt_tokens, args.vocab, batch)
            for name, params in (("", greedy), ("_sampled", sampled)):
                runs = sorted(
                    speedup(path, work, batch, params, args.k_max)
                    for _ in range(max(1, args.repeats))
                )
                _log(f"b{batch}{name} runs: " + ", ".join(f"{r[0]:.4f}" for r in runs))
                ratio, _, length, share = runs[len(runs) // 2]  # the median run
                print(f"RESULT spec.b{batch}{name}_speedup={ratio:.4f}")
                print(f"RESULT spec.b{batch}{name}_mean_acceptance_length={length:.4f}")
                print(f"RESULT spec.b{batch}{name}_draft_share={share:.4f}")
        if args.draft:
            from loraplex.bench.spec_draft import main_results

            if args.quick:
                args.cache_dir = path / "trained"
            elif args.cache_dir is None:
                from loraplex.platform.settings import default_data_dir

                args.cache_dir = default_data_dir() / "bench-quant"
            main_results(args, _log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

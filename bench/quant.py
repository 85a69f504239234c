"""`loraplex bench quant`: memory, decode speed and quality of each quantization choice, against
bf16 in the same run.

Quality (a trained model, since random weights make it meaningless): a small byte-level Llama
trained for `--train-steps` on the Python standard library's sources (cached under the data
dir), measured on held-out files: the mean KL divergence of next-token distributions from
bf16's (teacher-forced over `--kl-windows` windows) and the share of 128 greedy tokens equal
to bf16's. Memory and speed (weights must dominate): a random Llama of `--hidden` (2048) and
`--layers` (4): weight bytes over bf16's, and decode tokens/s at batch 1 and 32 over bf16's,
every choice's engine built first and timed in turns, round after round (best round kept), so
a change in the machine's load touches every choice alike.
The fp8 KV cache: blocks in the same memory over the `auto` cache, and its KL / agreement.

RESULT quant.<choice>_weight_bytes_ratio, _decode_speedup_b1, _decode_speedup_b32, _kl,
_greedy_agree for int8, int4, int4_sym, fp8; quant.fp8_kv_kl, quant.fp8_kv_greedy_agree,
quant.fp8_kv_blocks_ratio; and bf16's own tokens/s. Needs `transformers` (test dependency).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

from loraplex.bench._stdlib_llama import held_out_windows, trained_model
from loraplex.loader.quant_choices import QUANTIZED_ON_LOAD

CHOICES = QUANTIZED_ON_LOAD


def _log(msg: str) -> None:
    print(f"[bench quant] {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(prog="loraplex bench quant", description=__doc__)
    p.add_argument("--train-steps", type=int, default=1200)
    p.add_argument("--cache-dir", type=Path, default=None, help="default: <data dir>/bench-quant")
    p.add_argument("--kl-windows", type=int, default=6)
    p.add_argument("--window", type=int, default=384)
    p.add_argument("--greedy-prompts", type=int, default=3)
    p.add_argument("--greedy-tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--decode-steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (best kept)")
    p.add_argument("--choices", default=",".join(CHOICES))
    p.add_argument("--parts", default="quality,speed", help="quality, speed or both")
    return p


def _engine(path: Path, quant: str, kv: str = "auto", **kw: Any):  # noqa: ANN202
    from loraplex.platform.engine import LLM

    args = dict(quantization=quant, dtype="bfloat16", kv_cache_dtype=kv, max_loras=0)
    return LLM(str(path), **(args | kw))


@torch.no_grad()
def sequence_logprobs(llm: Any, tokens: list[int]) -> torch.Tensor:
    """Log-probs [n, V] of one teacher-forced sequence through the engine's model and its
    own (idle) paged KV cache, so the KV dtype is part of what is measured."""
    from loraplex.platform.engine.forward_context import ForwardContext, forward_context
    from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata

    core = llm.core
    bs, n = core.config.block_size, len(tokens)
    blocks = -(-n // bs)
    md = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        context_lens=torch.tensor([0], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None, :],
        max_query_len=n,
        max_seq_len=n,
        is_decode_only=False,
    )
    with forward_context(ForwardContext(attn=md)):
        hidden = core.model(torch.tensor(tokens), torch.arange(n))
    return torch.log_softmax(core.model.compute_logits(hidden).float(), dim=-1)


def quality(path: Path, quant: str, kv: str, windows: list, prompts: list, n: int):  # noqa: ANN201
    """(log-probs per window, greedy tokens per prompt) of one choice."""
    from loraplex.platform.engine import SamplingParams

    llm = _engine(path, quant, kv, num_gpu_blocks=512, max_model_len=1024, max_num_seqs=8)
    lps = [sequence_logprobs(llm, w) for w in windows]
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    greedy = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    blocks = llm.core.pool.num_blocks
    del llm
    gc.collect()
    return lps, greedy, blocks


def mean_kl(ref: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    """Mean over positions of KL(ref || got)."""
    kls = [(r.exp() * (r - g)).sum(-1) for r, g in zip(ref, got, strict=True)]
    return float(torch.cat(kls).mean())


def agree(ref: list[list[int]], got: list[list[int]]) -> float:
    """Share of greedy positions where the tokens are equal."""
    same = sum(a == b for x, y in zip(ref, got, strict=True) for a, b in zip(x, y, strict=True))
    return same / max(1, sum(len(x) for x in ref))


def speed_model(cache_dir: Path, args: argparse.Namespace) -> Path:
    """A random bf16 Llama large enough that weights dominate (cached)."""
    path = cache_dir / f"speed-llama-h{args.hidden}-l{args.layers}-i{args.intermediate}"
    if (path / "config.json").exists():
        return path
    from loraplex.bench._synthetic.models import hf_config, random_model

    _log(f"building a random Llama (hidden {args.hidden}, {args.layers} layers)")
    config = hf_config(
        "llama", tiny=False, vocab_size=259, hidden_size=args.hidden,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 128, num_key_value_heads=args.hidden // 256,
        max_position_embeddings=1024, tie_word_embeddings=False,
    )  # fmt: skip
    model = random_model(config, seed=0).to(torch.bfloat16)
    model.save_pretrained(str(path))
    del model
    gc.collect()
    return path


def decode_tokens_per_s(llm: Any, batch: int, steps: int) -> float:
    """Decode tokens/s of `batch` sequences after their prefill (engine steps timed)."""
    from loraplex.platform.engine import SamplingParams

    core = llm.core
    params = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    reqs = [core.add_request([1, *range(10 + i, 26 + i)], params) for i in range(batch)]
    while any(not r.output_token_ids for r in reqs):
        core.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        core.step()
    dt = time.perf_counter() - t0
    while core.has_unfinished():
        core.step()
    return batch * steps / dt


def speed_engine(path: Path, quant: str) -> Any:  # noqa: ANN401
    """An engine of one choice sized for the decode timings."""
    return _engine(path, quant, num_gpu_blocks=32 * 4 + 8, max_model_len=64, max_num_seqs=32,
                   enable_prefix_caching=False)  # fmt: skip


def timed_in_turns(engines: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple]:
    """{choice: (best tokens/s at batch 1, at batch 32)}, each round timing every choice."""
    best: dict[str, list[float]] = {c: [0.0, 0.0] for c in engines}
    for r in range(args.rounds):
        for choice, llm in engines.items():
            for i, batch in enumerate((1, 32)):
                tps = decode_tokens_per_s(llm, batch, args.decode_steps)
                best[choice][i] = max(best[choice][i], tps)
            _log(f"  round {r + 1}/{args.rounds} {choice}: b1 {best[choice][0]:.1f} "
                 f"b32 {best[choice][1]:.1f} tok/s (best so far)")  # fmt: skip
    return {c: tuple(v) for c, v in best.items()}


class _Results(dict):
    """RESULT lines printed as each is measured (a long run shows what it has so far)."""

    def __setitem__(self, name: str, value: float) -> None:
        super().__setitem__(name, value)
        print(f"RESULT {name}={value:.4f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the quantization benchmark and print RESULT lines."""
    args = build_parser().parse_args(argv)
    choices = [c for c in args.choices.split(",") if c]
    if args.cache_dir is None:
        from loraplex.platform.settings import default_data_dir

        args.cache_dir = default_data_dir() / "bench-quant"
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    results = _Results()

    parts = set(args.parts.split(","))
    if "quality" in parts:
        quality_results(args, choices, results)
    if "speed" in parts:
        speed_results(args, choices, results)
    return 0


def quality_results(args: argparse.Namespace, choices: list[str], results: dict) -> None:
    """KL, greedy agreement and fp8 KV blocks, on the trained model."""
    path = trained_model(args.cache_dir, args.train_steps, log=_log)
    windows = held_out_windows(args.kl_windows + args.greedy_prompts, args.window)
    kl_windows = windows[: args.kl_windows]
    prompts = [w[:64] for w in windows[args.kl_windows :]]
    _log("quality: bf16")
    ref_lps, ref_greedy, ref_blocks = quality(
        path, "bf16", "auto", kl_windows, prompts, args.greedy_tokens
    )
    for choice, kv in [*((c, "auto") for c in choices), ("bf16", "fp8")]:
        name = choice if kv == "auto" else "fp8_kv"
        _log(f"quality: {name}")
        lps, greedy, blocks = quality(path, choice, kv, kl_windows, prompts, args.greedy_tokens)
        results[f"quant.{name}_kl"] = mean_kl(ref_lps, lps)
        results[f"quant.{name}_greedy_agree"] = agree(ref_greedy, greedy)
    # blocks in the same KV memory
    auto = _engine(path, "bf16", kv_cache_memory_bytes=64 << 20).core.pool.num_blocks
    fp8 = _engine(path, "bf16", "fp8", kv_cache_memory_bytes=64 << 20).core.pool.num_blocks
    results["quant.fp8_kv_blocks_ratio"] = fp8 / auto
    del ref_blocks


def speed_results(args: argparse.Namespace, choices: list[str], results: dict) -> None:
    """Weight bytes and decode speed, on a random model whose weights dominate."""
    spath = speed_model(args.cache_dir, args)
    engines = {}
    for choice in ("bf16", *choices):
        _log(f"speed: building {choice}")
        engines[choice] = speed_engine(spath, choice)
    tps = timed_in_turns(engines, args)
    ref_bytes = engines["bf16"].core.weight_bytes
    results["quant.bf16_decode_tok_s_b1"] = tps["bf16"][0]
    results["quant.bf16_decode_tok_s_b32"] = tps["bf16"][1]
    for choice in choices:
        results[f"quant.{choice}_weight_bytes_ratio"] = (
            engines[choice].core.weight_bytes / ref_bytes
        )
        results[f"quant.{choice}_decode_speedup_b1"] = tps[choice][0] / tps["bf16"][0]
        results[f"quant.{choice}_decode_speedup_b32"] = tps[choice][1] / tps["bf16"][1]


if __name__ == "__main__":
    raise SystemExit(main())

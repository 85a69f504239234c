"""`loraplex bench moe-quant`: a Mixtral-shaped MoE served with quantized experts, against bf16
in the same run.

A random Mixtral (hidden 1024, expert width 2048, 8 experts, top 2, 2 layers by default:
experts hold most of the weights, as in real MoE bases) is served by the engine for each
choice (bf16 first, the baseline; deployments run quantized choices in bf16). Prints, per
choice, against bf16:

- RESULT moe_quant.<choice>_weight_bytes_ratio: the weight bytes the replica reports on
  `/state` (`EngineCore.weight_bytes`) over bf16's;
- RESULT moe_quant.<choice>_decode_speedup_b1 / _b8: decode tokens/s at batch 1 and 8 over
  bf16's, every choice timed in each round in turn, best round kept (on CPU decode is
  memory-bound: fewer weight bytes, faster steps).

Random weights make output quality meaningless here: `bench quant` measures quality on a
trained model; the MoE tests check the quantized experts against transformers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from loraplex.bench.quant import decode_tokens_per_s

CHOICES = ("bf16", "int8", "int4", "fp8")
BATCHES = (1, 8)


def _log(msg: str) -> None:
    print(f"[bench moe-quant] {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(prog="loraplex bench moe-quant", description=__doc__)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2048, help="expert width")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--decode-steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (best kept)")
    p.add_argument("--choices", default=",".join(CHOICES), help="bf16 always runs first")
    return p


def build_model(path: Path, args: argparse.Namespace) -> None:
    """A random bf16 Mixtral checkpoint in `path`."""
    from loraplex.bench._synthetic.models import hf_config, random_model

    config = hf_config(
        "mixtral", tiny=False, vocab_size=259, hidden_size=args.hidden,
        intermediate_size=args.intermediate, num_local_experts=args.experts,
        num_experts_per_tok=args.top_k, num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 128),
        num_key_value_heads=max(1, args.hidden // 256), max_position_embeddings=1024,
        tie_word_embeddings=False,
    )  # fmt: skip
    random_model(config, seed=0).to(torch.bfloat16).save_pretrained(str(path))


def _engine(path: Path, choice: str) -> Any:  # noqa: ANN401
    from loraplex.platform.engine import LLM

    return LLM(
        str(path), quantization=choice, dtype="bfloat16", max_loras=0, max_num_seqs=max(BATCHES),
        num_gpu_blocks=max(BATCHES) * 8 + 8, max_model_len=64, enable_prefix_caching=False,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print RESULT lines."""
    args = build_parser().parse_args(argv)
    choices = ["bf16", *[c for c in args.choices.split(",") if c and c != "bf16"]]
    with tempfile.TemporaryDirectory(prefix="bench-moe-quant-") as tmp:
        path = Path(tmp)
        _log(f"building a random Mixtral (hidden {args.hidden}, {args.experts} experts x "
             f"{args.intermediate}, {args.layers} layers)")  # fmt: skip
        build_model(path, args)
        engines = {}
        for choice in choices:
            engines[choice] = _engine(path, choice)
            _log(f"{choice}: {engines[choice].core.weight_bytes / 2**20:.1f} MiB of weights")
        best = {c: [0.0] * len(BATCHES) for c in choices}
        for r in range(args.rounds):
            for choice, llm in engines.items():
                for i, batch in enumerate(BATCHES):
                    tps = decode_tokens_per_s(llm, batch, args.decode_steps)
                    best[choice][i] = max(best[choice][i], tps)
                _log(f"round {r + 1}/{args.rounds} {choice}: "
                     + ", ".join(f"b{b} {t:.1f}" for b, t in zip(BATCHES, best[choice], strict=True))
                     + " tok/s (best so far)")  # fmt: skip
        ref_bytes = engines["bf16"].core.weight_bytes
        for choice in choices[1:]:
            ratio = engines[choice].core.weight_bytes / ref_bytes
            print(f"RESULT moe_quant.{choice}_weight_bytes_ratio={ratio:.4f}", flush=True)
            for i, batch in enumerate(BATCHES):
                speedup = best[choice][i] / best["bf16"][i]
                print(f"RESULT moe_quant.{choice}_decode_speedup_b{batch}={speedup:.4f}")
    return 0

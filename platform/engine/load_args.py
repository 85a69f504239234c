"""The model-loading options of `loraplex engine`: weight quantization and CUDA graphs."""

from __future__ import annotations

import argparse
from typing import Any


def _sizes(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes, got {text!r}") from None


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --quantization, --enforce-eager and --cuda-graph-sizes to the engine's parser."""
    parser.add_argument(
        "--quantization",
        default=None,
        help="weights on load: fp32, bf16 or fp16 (a cast; the model runs in that dtype)",
    )
    parser.add_argument(
        "--enforce-eager", action="store_true", help="never capture decode CUDA graphs"
    )
    parser.add_argument(
        "--cuda-graph-sizes",
        type=_sizes,
        default=None,
        help="decode batch sizes to capture, e.g. 1,2,4,8 (default: 1,2,4,8,16,... max-num-seqs)",
    )


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineConfig fields these options set."""
    return {
        "quantization": getattr(args, "quantization", None),
        "enforce_eager": bool(getattr(args, "enforce_eager", False)),
        "cuda_graph_sizes": getattr(args, "cuda_graph_sizes", None),
    }

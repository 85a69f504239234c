"""Registers the operator commands on `loraplex`'s parser (called by platform/cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import adapter_cmds, admin_cmds
from .client import URL_ENV, CliError, guarded


def common_options() -> argparse.ArgumentParser:
    """`--url` and `--json`, shared by every API client command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", help=f"the API's base URL (default: ${URL_ENV} or http://127.0.0.1:8000)"
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON answer")
    return common


def cmd_demo_adapter(args: argparse.Namespace) -> int:
    """Write a small PEFT LoRA adapter for the demo model (or `--model`'s shape)."""
    from .demo_adapter import ALL_TARGETS, write_demo_adapter

    targets = ALL_TARGETS if args.targets == "all" else tuple(args.targets.split(","))
    try:
        out = write_demo_adapter(
            args.out,
            model_dir=args.model,
            rank=args.rank,
            alpha=args.alpha,
            targets=targets,
            seed=args.seed,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(out)
    return 0


def add_parsers(sub: Any) -> None:
    """Add `tenants`, `keys`, `deployments`, `adapters` and `demo` to `loraplex`."""
    common = common_options()
    admin_cmds.add_parsers(sub, common)
    adapter_cmds.add_parsers(sub, common)
    demo = sub.add_parser("demo", help="write demo files (a PEFT adapter for the demo model)")
    ds = demo.add_subparsers(dest="demo_command", required=True, metavar="WHAT")
    p = ds.add_parser("adapter", help="write a small PEFT LoRA adapter for the demo model")
    p.add_argument("--out", type=Path, default=Path("demo-adapter"))
    p.add_argument("--model", type=Path, help="a Llama folder to fit instead of the demo model")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, help="lora_alpha (default: 2 x rank)")
    p.add_argument(
        "--targets", default="q_proj,v_proj", help="comma-separated projections, or 'all'"
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=guarded(cmd_demo_adapter))

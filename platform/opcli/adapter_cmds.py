"""`loraplex adapters push|list|show|delete`: a tenant's adapters (LORAPLEX_API_KEY)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .client import CliError, adapter_path, connect, guarded
from .output import Column, emit, field, print_object, print_table

ADAPTER_COLUMNS: list[Column] = [
    field("name"),
    field("base_model"),
    field("version"),
    field("status"),
    ("rank", lambda a: (a.get("latest_version") or {}).get("rank")),
    ("bytes", lambda a: (a.get("latest_version") or {}).get("bytes")),
    field("created_at"),
]
VERSION_FIELDS: list[Column] = [
    field("name"),
    field("version"),
    field("status"),
    field("error"),
    field("rank"),
    field("alpha"),
    field("use_rslora"),
    field("target_modules"),
    field("bytes"),
    field("sha256"),
    field("id"),
    field("adapter_id"),
    field("created_at"),
    field("updated_at"),
]


def _report(version: dict[str, Any]) -> int:
    """Print a finished validation: 0 when ready, 1 with the validation error when failed."""
    if version["status"] == "ready":
        print(
            f"{version['name']} v{version['version']} is ready "
            f"(rank {version['rank']}, targets {','.join(version['target_modules'] or [])})"
        )
        return 0
    print(
        f"error: {version['name']} v{version['version']} failed validation: {version['error']}",
        file=sys.stderr,
    )
    return 1


def cmd_adapters_push(args: argparse.Namespace) -> int:
    """Upload a PEFT folder as a new version and wait for its validation."""
    from .push import PRESIGN_FROM, push

    presign_from = 0 if args.presigned else (args.presign_from or PRESIGN_FROM)
    with connect(args.url, "tenant") as api:
        result = push(
            api,
            Path(args.dir),
            args.name,
            args.base_model,
            presign_from=presign_from,
            wait=not args.no_wait,
            timeout_s=args.timeout,
        )
    if args.json:
        emit(result, True, print)
        return 0 if result["status"] != "failed" else 1
    if args.no_wait:
        print(f"{result['name']} v{result['version']} is {result['status']}")
        return 0
    return _report(result)


def cmd_adapters_list(args: argparse.Namespace) -> int:
    """The tenant's adapters and their latest versions."""
    with connect(args.url, "tenant") as api:
        data = api.json("GET", "/v1/adapters")["data"]
        emit(data, args.json, lambda rows: print_table(rows, ADAPTER_COLUMNS))
    return 0


def cmd_adapters_show(args: argparse.Namespace) -> int:
    """One adapter's latest version (or `--version N`), with any validation error."""
    with connect(args.url, "tenant") as api:
        if args.version is None:
            adapter = api.json("GET", adapter_path(args.name))
            version = adapter.get("latest_version")
            if version is None:
                raise CliError(f"adapter {args.name!r} has no version yet")
            version = {**version, "base_model": adapter["base_model"]}
        else:
            version = api.json("GET", f"{adapter_path(args.name)}/versions/{args.version}")
    emit(version, args.json, lambda v: print_object(v, [field("base_model"), *VERSION_FIELDS]))
    return 0


def cmd_adapters_delete(args: argparse.Namespace) -> int:
    """Delete an adapter and all its versions."""
    with connect(args.url, "tenant") as api:
        gone = api.json("DELETE", adapter_path(args.name))
    emit(gone, args.json, lambda g: print(f"deleted adapter {g['name']} ({g['id']})"))
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `adapters` on the top-level subparsers."""
    adapters = sub.add_parser("adapters", help="manage your adapters (tenant API key)")
    s = adapters.add_subparsers(dest="adapters_command", required=True, metavar="ACTION")
    p = s.add_parser("push", parents=[common], help="upload a PEFT adapter folder")
    p.add_argument("dir", help="folder with adapter_config.json and adapter_model.safetensors")
    p.add_argument("--name", required=True, help="adapter name (a new version if it exists)")
    p.add_argument("--base-model", required=True, help="the registered base model it adapts")
    p.add_argument("--presigned", action="store_true", help="always use the presigned upload")
    p.add_argument(
        "--presign-from",
        type=int,
        metavar="BYTES",
        help="weights this large go through presigned multipart (default 8 MiB)",
    )
    p.add_argument("--no-wait", action="store_true", help="return once uploaded")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for validation")
    p.set_defaults(func=guarded(cmd_adapters_push))
    p = s.add_parser("list", parents=[common], help="list your adapters")
    p.set_defaults(func=guarded(cmd_adapters_list))
    p = s.add_parser("show", parents=[common], help="show an adapter version and its status")
    p.add_argument("name")
    p.add_argument("--version", type=int, help="a version number (default: the latest)")
    p.set_defaults(func=guarded(cmd_adapters_show))
    p = s.add_parser("delete", parents=[common], help="delete an adapter and all its versions")
    p.add_argument("name")
    p.set_defaults(func=guarded(cmd_adapters_delete))

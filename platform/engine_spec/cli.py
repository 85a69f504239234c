"""The `loraplex engine` command line, generated from `EngineConfig`'s fields (and the few
server options), and parsed back: `engine_args(config) -> argv`, `parse_engine_args(argv)`.

One field, one option: `max_lora_rank` is `--max-lora-rank N`; a boolean is
`--x` / `--no-x`; a list is comma-separated; an optional field left at None is left out.
`engine_args` writes only what differs from the defaults, so the command line shows what a
deployment chose, and `parse_engine_args(engine_args(c))` gives `c` back.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from loraplex.platform.engine_spec.config import EngineConfig


@dataclass(frozen=True)
class ServerOptions:
    """Where the replica's HTTP server listens, and how much it logs."""

    host: str | None = field(
        default=None,
        metadata={
            "help": "internal address to listen on (default: LORAPLEX_REPLICA_HOST, 127.0.0.1); "
            "the replica API is for the gateway, never the public address"
        },
    )
    port: int = field(default=8100, metadata={"help": "port to listen on"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    fd: int | None = field(
        default=None,
        metadata={"help": "serve on this inherited listening socket instead of host:port"},
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _sizes(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes, got {text!r}") from None


def _base_type(hint: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed) of a field's annotation."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


def _cli_fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [
        (f, _base_type(hints[f.name])[0])
        for f in dataclasses.fields(cls)
        if f.metadata.get("cli", True)
    ]


def _add_options(parser: argparse._ActionsContainer, cls: type) -> None:
    for f, kind in _cli_fields(cls):
        required = f.default is dataclasses.MISSING
        default = None if required else f.default
        help_ = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(
                _flag(f.name), action=argparse.BooleanOptionalAction, default=default, help=help_
            )
        elif typing.get_origin(kind) is list:
            parser.add_argument(_flag(f.name), type=_sizes, default=default, help=help_)
        elif kind in (int, float, str):
            parser.add_argument(
                _flag(f.name), type=kind, default=default, required=required, help=help_
            )
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for {kind!r}")


def _args_of(obj: Any) -> list[str]:
    out: list[str] = []
    for f, kind in _cli_fields(type(obj)):
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        if kind is bool:
            out.append(_flag(f.name) if value else "--no-" + f.name.replace("_", "-"))
        elif value is None:
            raise ValueError(f"{f.name} is None but its default is {f.default!r}")
        elif typing.get_origin(kind) is list:
            out += [_flag(f.name), ",".join(str(v) for v in value)]
        else:
            out += [_flag(f.name), str(value)]
    return out


def build_engine_parser() -> argparse.ArgumentParser:
    """The `loraplex engine` parser: one option per EngineConfig field, plus ServerOptions."""
    parser = argparse.ArgumentParser(prog="loraplex engine", description="Run one engine replica.")
    _add_options(parser, EngineConfig)
    _add_options(parser.add_argument_group("server"), ServerOptions)
    return parser


def engine_args(config: EngineConfig, server: ServerOptions | None = None) -> list[str]:
    """The `loraplex engine` options that reproduce `config` (and `server`): only non-defaults,
    `--model` always. The storage config is not among them: it comes from the environment."""
    return _args_of(config) + (_args_of(server) if server is not None else [])


def _split(ns: argparse.Namespace, cls: type, **extra: Any) -> Any:
    values = {f.name: getattr(ns, f.name) for f, _ in _cli_fields(cls)}
    return cls(**values, **extra)


def parse_engine_args(argv: list[str], **extra: Any) -> tuple[EngineConfig, ServerOptions]:
    """Parse `loraplex engine` options into (EngineConfig, ServerOptions); `extra` sets
    EngineConfig fields that are not options (e.g. `storage`). Exits on bad options, as
    argparse does; raises ValueError for values EngineConfig refuses."""
    ns = build_engine_parser().parse_args(argv)
    return _split(ns, EngineConfig, **extra), _split(ns, ServerOptions)

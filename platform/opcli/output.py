"""How the operator commands print: aligned columns for lists, `key: value` lines for one
object, or raw JSON with `--json` for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

Column = tuple[str, Callable[[dict[str, Any]], Any]]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def print_json(data: Any, out: TextIO | None = None) -> None:
    """Pretty JSON on stdout."""
    print(json.dumps(data, indent=2, sort_keys=True), file=out or sys.stdout)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> None:
    """One header line and one aligned line per row."""
    cells = [[c[0].upper() for c in columns]]
    cells += [[_cell(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def print_object(data: dict[str, Any], fields: Sequence[Column]) -> None:
    """`field: value` lines."""
    width = max(len(name) for name, _ in fields)
    for name, get in fields:
        print(f"{name.ljust(width)}  {_cell(get(data))}")


def emit(data: Any, as_json: bool, show: Callable[[Any], None]) -> None:
    """`data` as JSON when asked, else through `show`."""
    if as_json:
        print_json(data)
    else:
        show(data)


def field(name: str) -> Column:
    """A column reading `name` from the object."""
    return (name, lambda row: row.get(name))

"""Fifty JSON schemas of increasing difficulty (flat objects, enums, bounded numbers, patterns,
arrays with min/max items, nested objects, `anyOf`, optional keys), for the structured-output
tests and `loraplex bench structured`. Strings and arrays are bounded: a random-weight model
would otherwise fill them until `max_tokens`, which is a valid but unfinished document."""

from __future__ import annotations

from typing import Any

_STR = {"type": "string", "maxLength": 12}
_INT = {"type": "integer", "minimum": -50, "maximum": 500}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


def _flat(i: int) -> dict[str, Any]:
    kinds: list[dict[str, Any]] = [
        _STR,
        _INT,
        {"type": "boolean"},
        {"enum": ["red", "green", "blue"]},
        {"type": "number", "minimum": 0, "maximum": 10},
        {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        {"const": "fixed"},
        {"type": "null"},
    ]
    return _obj({f"k{j}": kinds[(i + j) % len(kinds)] for j in range(1 + i % 5)})


def _array(i: int) -> dict[str, Any]:
    items = [_STR, _INT, {"enum": ["a", "b", "c"]}, _obj({"id": _INT, "tag": _STR})][i % 4]
    lo = i % 3
    return _obj({"items": {"type": "array", "items": items, "minItems": lo, "maxItems": lo + 3}})


def _nested(i: int) -> dict[str, Any]:
    inner = _obj({"city": _STR, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})
    deep = _obj({"level": {"type": "integer", "minimum": 1, "maximum": 3}, "inner": inner})
    props: dict[str, Any] = {"name": _STR, "address": inner}
    if i % 2:
        props["deep"] = deep
    if i % 3 == 0:
        props["scores"] = {"type": "array", "items": _INT, "minItems": 1, "maxItems": 4}
    return _obj(props)


def _any_of(i: int) -> dict[str, Any]:
    options: list[dict[str, Any]] = [
        _obj({"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 9}}),
        _obj({"kind": {"const": "square"}, "side": _INT}),
        _STR,
        {"type": "null"},
    ]
    return _obj({"shape": {"anyOf": options[: 2 + i % 3]}, "note": _STR}, required=["shape"])


def _optional(i: int) -> dict[str, Any]:
    props = {
        "id": {"type": "integer", "minimum": 0, "maximum": 10_000},
        "title": _STR,
        "status": {"enum": ["draft", "open", "closed"]},
        "labels": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3},
        "owner": _obj({"login": _STR, "admin": {"type": "boolean"}}, required=["login"]),
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    }
    keys = list(props)[: 3 + i % 4]
    return _obj({k: props[k] for k in keys}, required=keys[: 1 + i % 3])


def json_schemas() -> list[dict[str, Any]]:
    """The fifty schemas, easiest first (ten of each family, families in rising difficulty)."""
    out: list[dict[str, Any]] = []
    for family in (_flat, _array, _optional, _nested, _any_of):
        out += [family(i) for i in range(10)]
    return out

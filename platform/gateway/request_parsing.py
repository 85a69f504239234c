"""A completion request's body, from bytes to the endpoint's request model: JSON (refused when
malformed or nested too deeply) and the endpoint's fields.

Large bodies are parsed in a process of its own (`ParseProcess`): parsing megabytes of JSON
holds Python's GIL for the whole parse, so on a worker thread of the API it would still stall
the event loop every other tenant's request runs on. Small bodies are parsed where they are.
"""

from __future__ import annotations

import json
from typing import Any

from loraplex.platform.errors import HttpError, LoraplexError
from loraplex.platform.gateway.endpoints import CHAT, TEXT, Endpoint
from loraplex.platform.gateway.parse_process import ParseProcess

MAX_JSON_DEPTH = 32
ENDPOINTS: dict[str, Endpoint] = {CHAT.name: CHAT, TEXT.name: TEXT}


def _depth(value: Any, limit: int) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest


def parse_json_body(raw: bytes) -> Any:
    """The JSON of a request body: 400 `invalid_json` for bytes that are not JSON or nest
    deeper than `MAX_JSON_DEPTH` (Python's parser gives up on deep nesting with a
    RecursionError, not a ValueError)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        reason = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise HttpError(
            400, f"The request body is not valid JSON: {reason}", code="invalid_json"
        ) from None
    if _depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise HttpError(400, "The request body is nested too deeply.", code="invalid_json")
    return body


def parse_request(raw: bytes, endpoint: Endpoint, adapter: str | None) -> Any:
    """The body as the request model of `endpoint` (400 for bad JSON or fields); `adapter`:
    the adapter a per-adapter route names, the model when the body names none."""
    body = parse_json_body(raw)
    if adapter is not None and isinstance(body, dict):
        body = {**body, "model": body.get("model") or adapter}
    return endpoint.parse(body)


def _parse_in_child(raw: bytes, endpoint: str, adapter: str | None) -> tuple[Any, ...]:
    """In the parse process: ("ok", model) or ("error", the error's fields); errors cross as
    data (an exception with keyword-only fields does not unpickle)."""
    try:
        return ("ok", parse_request(raw, ENDPOINTS[endpoint], adapter))
    except LoraplexError as exc:
        return ("error", exc.status, exc.message, exc.type, exc.param, exc.code)


def parse_elsewhere(
    process: ParseProcess, raw: bytes, endpoint: Endpoint, adapter: str | None
) -> Any:
    """`parse_request` in the parse process (call from a worker thread: this waits)."""
    out = process.call(_parse_in_child, raw, endpoint.name, adapter)
    if out[0] == "ok":
        return out[1]
    _, status, message, type_, param, code = out
    raise HttpError(status, message, type=type_, param=param, code=code)

"""A completion request's body, from bytes to the endpoint's request model in one step (the
JSON parser fills the model; refused when malformed, nested too deeply, or with bad fields).

Large bodies are parsed in a process of its own (`ParseProcess`): parsing megabytes of JSON
holds Python's GIL for the whole parse, so on a worker thread of the API it would still stall
the event loop every other tenant's request runs on. Small bodies are parsed where they are.
"""

from __future__ import annotations

from typing import Any

from loraplex.platform.errors import HttpError, LoraplexError
from loraplex.platform.gateway.endpoints import CHAT, TEXT, Endpoint
from loraplex.platform.gateway.parse_process import ParseProcess

ENDPOINTS: dict[str, Endpoint] = {CHAT.name: CHAT, TEXT.name: TEXT}


def parse_request(raw: bytes, endpoint: Endpoint, adapter: str | None) -> Any:
    """The body's bytes as the request model of `endpoint`, parsed straight into it (400 for
    bad JSON, nesting past the parser's limit, or bad fields); `adapter`: the adapter a
    per-adapter route names, the model when the body names none."""
    return endpoint.parse(raw, adapter)


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

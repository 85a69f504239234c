"""A completion request's body, from bytes to the endpoint's request model in one step (the
JSON parser fills the model; refused when malformed, nested too deeply, or with bad fields).

Large bodies are parsed in a process of its own (`ParseProcess`): parsing megabytes of JSON
holds Python's GIL for the whole parse, so on a worker thread of the API it would still stall
the event loop every other tenant's request runs on. Small bodies are parsed where they are.
A large body stays parked in that process until the route has checked its prompt's size
against the model (`Parked`): a prompt refused for its length never crosses back.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from loraplex.platform.errors import HttpError, LoraplexError
from loraplex.platform.gateway.completion import PromptSize, prompt_size
from loraplex.platform.gateway.endpoints import CHAT, TEXT, Endpoint
from loraplex.platform.gateway.parse_process import ParseProcess

ENDPOINTS: dict[str, Endpoint] = {CHAT.name: CHAT, TEXT.name: TEXT}
# Parked bodies the parse process keeps at most (the oldest go first): a route takes or drops
# its own within moments, so only a route that vanished between the two leaves one behind.
MAX_PARKED = 32


def parse_request(raw: bytes, endpoint: Endpoint, adapter: str | None) -> Any:
    """The body's bytes as the request model of `endpoint`, parsed straight into it (400 for
    bad JSON, nesting past the parser's limit, or bad fields); `adapter`: the adapter a
    per-adapter route names, the model when the body names none."""
    return endpoint.parse(raw, adapter)


@dataclass(frozen=True)
class Parked:
    """A body parsed and kept in the parse process: what a route decides on before taking
    it (the model it names, its prompt's size when the body alone says it)."""

    handle: str
    model: str
    prompt: PromptSize | None


_parked: OrderedDict[str, Any] = OrderedDict()  # in the parse process only


def _error_fields(exc: LoraplexError) -> tuple[Any, ...]:
    # errors cross as data (an exception with keyword-only fields does not unpickle)
    return ("error", exc.status, exc.message, exc.type, exc.param, exc.code)


def _raise(out: tuple[Any, ...]) -> None:
    _, status, message, type_, param, code = out
    raise HttpError(status, message, type=type_, param=param, code=code)


def _parse_in_child(raw: bytes, endpoint: str, adapter: str | None) -> tuple[Any, ...]:
    """In the parse process: ("ok", model) or ("error", the error's fields)."""
    try:
        return ("ok", parse_request(raw, ENDPOINTS[endpoint], adapter))
    except LoraplexError as exc:
        return _error_fields(exc)


def _park_in_child(raw: bytes, endpoint: str, adapter: str | None) -> tuple[Any, ...]:
    """In the parse process: ("ok", Parked) with the body kept there, or ("error", ...)."""
    try:
        body = parse_request(raw, ENDPOINTS[endpoint], adapter)
    except LoraplexError as exc:
        return _error_fields(exc)
    handle = secrets.token_hex(16)  # never reused, even by a restarted process
    _parked[handle] = body
    while len(_parked) > MAX_PARKED:
        _parked.popitem(last=False)
    return ("ok", Parked(handle, body.model, prompt_size(body)))


def _take_in_child(handle: str) -> Any:
    """In the parse process: the parked body (None when it is gone)."""
    return _parked.pop(handle, None)


def _drop_in_child(handle: str) -> None:
    """In the parse process: forget the parked body (nothing crosses back)."""
    _parked.pop(handle, None)


def parse_elsewhere(
    process: ParseProcess, raw: bytes, endpoint: Endpoint, adapter: str | None
) -> Any:
    """`parse_request` in the parse process (call from a worker thread: this waits)."""
    out = process.call(_parse_in_child, raw, endpoint.name, adapter)
    if out[0] != "ok":
        _raise(out)
    return out[1]


def park_elsewhere(
    process: ParseProcess, raw: bytes, endpoint: Endpoint, adapter: str | None
) -> Parked:
    """Parse the body in the parse process and keep it there (call from a worker thread);
    400s as `parse_request` raises them. Then `take` it, or `drop` it."""
    out = process.call(_park_in_child, raw, endpoint.name, adapter)
    if out[0] != "ok":
        _raise(out)
    parked: Parked = out[1]
    return parked


def take(
    process: ParseProcess, parked: Parked, raw: bytes, endpoint: Endpoint, adapter: str | None
) -> Any:
    """The parked body (call from a worker thread); parsed again from `raw` in the rare case
    the process no longer has it (restarted, or it outlived `MAX_PARKED` newer ones)."""
    body = process.call(_take_in_child, parked.handle)
    return body if body is not None else parse_elsewhere(process, raw, endpoint, adapter)


def drop(process: ParseProcess, parked: Parked) -> None:
    """Let the process forget a parked body the route will not take (does not wait)."""
    process.post(_drop_in_child, parked.handle)

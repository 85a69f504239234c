"""Which OpenAI request fields the gateway serves and which it refuses, so nothing a client
sends is silently dropped: a field that is neither served (a field of the request model) nor
listed here as acceptable in a given value is a 400 `unsupported_parameter` naming it. The
README's field table says the same in prose; a test keeps the two in step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loraplex.platform.errors import HttpError

# Fields we accept only in the value that asks for what we do anyway.
ACCEPTED_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "modalities": (lambda v: v == ["text"], 'only ["text"] output is served'),
    "service_tier": (lambda v: v in ("auto", "default"), 'only "auto" or "default" is served'),
    "store": (lambda v: v is False, "stored completions are not offered"),
    "best_of": (lambda v: v == 1, "best_of other than 1 is not served"),
}

# Known OpenAI fields we do not serve, with the reason the client reads.
REFUSED: dict[str, str] = {
    "audio": "audio output is not served",
    "functions": "the deprecated `functions` is not served; use `tools`",
    "function_call": "the deprecated `function_call` is not served; use `tool_choice`",
    "prediction": "predicted outputs are not served",
    "reasoning_effort": "these models do not reason in a separate channel",
    "verbosity": "`verbosity` is not served",
    "web_search_options": "web search is not served",
    "metadata": "stored completions (and their metadata) are not offered",
    "prompt_cache_key": "the prefix cache is keyed by tenant and content; no client key is used",
    "safety_identifier": "`safety_identifier` is not served",
}


def check_fields(body: dict[str, Any], served: set[str]) -> None:
    """400 `unsupported_parameter` for the first field of `body` that is not served (a null
    value is the same as leaving a known OpenAI field out)."""
    for name, value in body.items():
        if name in served:
            continue
        if name in ACCEPTED_VALUES:
            ok, why = ACCEPTED_VALUES[name]
            if value is None or ok(value):
                continue
            raise _unsupported(name, f"`{name}`: {why}.")
        if name in REFUSED:
            if value is None:
                continue
            raise _unsupported(name, f"`{name}` is not supported: {REFUSED[name]}.")
        raise _unsupported(name, f"Unrecognized request argument supplied: {name}")


def _unsupported(name: str, message: str) -> HttpError:
    return HttpError(400, message, param=name, code="unsupported_parameter")

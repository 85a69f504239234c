"""Large bodies are parsed in a process of their own: the same request models and the same
400s as parsing in place, from another process (whose GIL is not the event loop's)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.endpoints import CHAT, TEXT
from loraplex.platform.gateway.parse_process import ParseProcess
from loraplex.platform.gateway.request_parsing import parse_elsewhere, parse_request


@pytest.fixture(scope="module")
def parser() -> Iterator[ParseProcess]:
    p = ParseProcess()
    yield p
    p.close()


def test_it_runs_in_another_process(parser: ParseProcess) -> None:
    assert parser.call(os.getpid) != os.getpid()


def test_it_runs_at_a_lower_priority(parser: ParseProcess) -> None:
    """A tenant's megabytes of JSON yield the CPU to everyone else's request path."""
    from loraplex.platform.low_priority import NICE

    assert parser.call(os.nice, 0) >= os.nice(0) + NICE


def test_the_same_models_as_parsing_in_place(parser: ParseProcess) -> None:
    chat = json.dumps(
        {"messages": [{"role": "user", "content": "word " * 50_000}], "max_tokens": 3}
    ).encode()
    text = json.dumps({"model": "m", "prompt": "x" * 200_000, "logprobs": 2}).encode()
    assert parse_elsewhere(parser, chat, CHAT, "my-adapter") == parse_request(
        chat, CHAT, "my-adapter"
    )
    assert parse_elsewhere(parser, text, TEXT, None) == parse_request(text, TEXT, None)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000,
        b'{"model": "m", "prompt": "p", "best_of": 3, "frobnicate": 1}',
        b"not json",
        b'{"model": "m", "prompt": "p", "max_tokens": -1}',
    ],
)
def test_the_same_refusals_as_parsing_in_place(parser: ParseProcess, raw: bytes) -> None:
    with pytest.raises(HttpError) as here:
        parse_request(raw, TEXT, None)
    with pytest.raises(HttpError) as there:
        parse_elsewhere(parser, raw, TEXT, None)
    got, want = there.value, here.value
    assert (got.status, got.message, got.code, got.param, got.type) == (
        want.status, want.message, want.code, want.param, want.type,
    )  # fmt: skip

"""Large bodies are parsed in a process of their own: the same request models and the same
400s as parsing in place, from another process (whose GIL is not the event loop's)."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.up_process import alive

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.completion import PromptSize
from loraplex.platform.gateway.endpoints import CHAT, TEXT
from loraplex.platform.gateway.parse_process import ParseProcess
from loraplex.platform.gateway.request_parsing import (
    MAX_PARKED,
    drop,
    park_elsewhere,
    parse_elsewhere,
    parse_request,
    take,
)


@pytest.fixture(scope="module")
def parser() -> Iterator[ParseProcess]:
    p = ParseProcess()
    yield p
    p.close()


def _parked_count() -> int:
    from loraplex.platform.gateway import request_parsing

    return len(request_parsing._parked)


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
    want = here.value
    for elsewhere in (parse_elsewhere, park_elsewhere):
        with pytest.raises(HttpError) as there:
            elsewhere(parser, raw, TEXT, None)
        got = there.value
        assert (got.status, got.message, got.code, got.param, got.type) == (
            want.status, want.message, want.code, want.param, want.type,
        )  # fmt: skip


def test_a_parked_body_crosses_back_as_its_model_and_prompt_size_only(
    parser: ParseProcess,
) -> None:
    """A 4 MB prompt refused for its length never crosses back from the parse process: the
    route decides on the model's name and the prompt's UTF-8 size, and takes the body only
    when it goes on."""
    prompt = "wörd " * (800 * 1024)  # 4.7 MB in UTF-8, 4 MB of characters
    raw = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 7}).encode()
    parked = park_elsewhere(parser, raw, TEXT, None)
    assert len(pickle.dumps(parked)) < 1024
    assert parked.model == "m"
    assert parked.prompt == PromptSize(len(prompt.encode()), 7, "prompt")
    assert take(parser, parked, raw, TEXT, None) == parse_request(raw, TEXT, None)


def test_a_chats_prompt_size_waits_for_its_template(parser: ParseProcess) -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": "x" * 300_000}]}).encode()
    parked = park_elsewhere(parser, raw, CHAT, "my-adapter")
    assert parked.model == "my-adapter" and parked.prompt is None
    drop(parser, parked)


def test_a_body_the_process_no_longer_has_is_parsed_again(parser: ParseProcess) -> None:
    """Dropped (or lost with a restarted process): `take` still returns the body."""
    raw = json.dumps({"model": "m", "prompt": "y" * 300_000}).encode()
    parked = park_elsewhere(parser, raw, TEXT, None)
    drop(parser, parked)
    assert take(parser, parked, raw, TEXT, None) == parse_request(raw, TEXT, None)


def test_the_process_keeps_a_bounded_number_of_parked_bodies(parser: ParseProcess) -> None:
    """Bodies of routes that vanished between parking and taking do not pile up."""
    raw = json.dumps({"model": "m", "prompt": "z" * 1000}).encode()
    first = [park_elsewhere(parser, raw, TEXT, None) for _ in range(MAX_PARKED + 5)]
    assert parser.call(_parked_count) == MAX_PARKED
    for parked in first:
        drop(parser, parked)
    assert parser.call(_parked_count) == 0


def test_starting_spawns_the_process_with_the_parser_loaded_before_the_first_body() -> None:
    """The gateway starts its parse process as it starts: the first tenant to send a large
    body does not wait for a process to spawn and import the parser (0.8-0.9 s here)."""
    module = "loraplex.platform.gateway.request_parsing"
    process = ParseProcess(preload=module)
    try:
        before = set(multiprocessing.active_children())
        process.start()  # does not wait
        deadline = time.monotonic() + 60
        while not set(multiprocessing.active_children()) - before:
            assert time.monotonic() < deadline, "no parse process started"
            time.sleep(0.05)
        assert process.call(os.getpid) in {p.pid for p in multiprocessing.active_children()}
        # (asked through a builtin: a function of this module would import the parser there)
        loaded = f"{module!r} in __import__('sys').modules"
        assert process.call(eval, loaded)  # imported as the process started
        bare = ParseProcess()
        try:
            assert not bare.call(eval, loaded)  # without `preload`, it would not be
        finally:
            bare.close()
    finally:
        process.close()


GATEWAY = """
import os, time
from loraplex.platform.gateway.parse_process import ParseProcess

if __name__ == "__main__":
    process = ParseProcess()
    print(process.call(os.getpid), flush=True)
    time.sleep(600)
"""


def test_the_parse_process_ends_when_its_gateway_is_killed(tmp_path: Path) -> None:
    """A gateway killed outright (SIGKILL, the OOM killer) sends its parse process no shutdown,
    and the queue that process waits on never ends (it holds the queue's write end itself):
    it must notice its parent is gone, not live on (100 MB each) for the machine's life."""
    script = tmp_path / "gateway.py"
    script.write_text(GATEWAY)
    gateway = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert gateway.stdout is not None
        worker = int(gateway.stdout.readline())
    finally:
        gateway.kill()
        gateway.wait()
    deadline = time.monotonic() + 30
    while alive(worker):  # and not a zombie
        assert time.monotonic() < deadline, "the parse process outlived its gateway"
        time.sleep(0.1)

"""What a request's usage row says about its latency: time to the first token, the mean gap
between later tokens, and whether it broke (the console's charts read these)."""

from __future__ import annotations

import time

import pytest

from loraplex.platform.gateway.completion import Tally
from loraplex.platform.wire import DeltaEvent, FinishEvent, Usage


def _token(text: str) -> DeltaEvent:
    return DeltaEvent(token_ids=[1], text=text)


def test_ttft_and_mean_itl_from_token_arrivals() -> None:
    started = time.monotonic()
    tally = Tally(prompt_tokens=5)
    time.sleep(0.05)
    tally.add(_token("a"))
    for _ in range(4):
        time.sleep(0.02)
        tally.add(_token("b"))
    usage = Usage(prompt_tokens=5, completion_tokens=5, cached_tokens=0)
    tally.add(FinishEvent(finish_reason="stop", usage=usage))  # no tokens: not an arrival
    ttft, itl = tally.latencies(started)
    assert 45 <= ttft < 500
    assert itl == pytest.approx((tally.last_token_at - tally.first_token_at) * 1000 / 4, rel=1e-3)
    assert 15 <= itl < 300
    assert not tally.failed


def test_no_tokens_no_latency() -> None:
    tally = Tally(prompt_tokens=3)
    assert tally.latencies(time.monotonic()) == (None, None)
    tally.add(_token("x"))
    ttft, itl = tally.latencies(time.monotonic() - 0.01)
    assert ttft is not None and itl is None  # one token: no gap to measure

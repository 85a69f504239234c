"""What a request's usage row says about its latency: time to the first token, the mean gap
between later tokens, and whether it broke (the console's charts read these)."""

from __future__ import annotations

import time

import pytest

from loraplex.platform.gateway.completion import Tally
from loraplex.platform.gateway.outputs import ChoiceEvent


def test_ttft_and_mean_itl_from_token_arrivals() -> None:
    started = time.monotonic()
    tally = Tally(prompt_tokens=5)
    time.sleep(0.05)
    tally.add(ChoiceEvent(0, "a", num_tokens=1))
    for _ in range(4):
        time.sleep(0.02)
        tally.add(ChoiceEvent(0, "b", num_tokens=1))
    tally.add(ChoiceEvent(0, finish_reason="stop"))  # no tokens: not an arrival
    ttft, itl = tally.latencies(started)
    assert 45 <= ttft < 500
    assert itl == pytest.approx((tally.last_token_at - tally.first_token_at) * 1000 / 4, rel=1e-3)
    assert 15 <= itl < 300
    assert not tally.failed


def test_no_tokens_no_latency() -> None:
    tally = Tally(prompt_tokens=3)
    assert tally.latencies(time.monotonic()) == (None, None)
    tally.add(ChoiceEvent(0, "x", num_tokens=1))
    ttft, itl = tally.latencies(time.monotonic() - 0.01)
    assert ttft is not None and itl is None  # one token: no gap to measure

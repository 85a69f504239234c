"""Replica events to choice events: the replica detokenizes and applies stop strings, so text
and logprob token strings pass through unchanged; the finish carries the usage counts."""

from __future__ import annotations

from loraplex.platform.gateway.outputs import choice_event
from loraplex.platform.wire import DeltaEvent, FinishEvent, TokenLogprobs, TopLogprob, Usage


def test_delta_passes_text_and_logprobs_through() -> None:
    lp = TokenLogprobs(
        token_id=7,
        token=" cat",
        logprob=-0.5,
        top=[TopLogprob(token_id=7, token=" cat", logprob=-0.5),
             TopLogprob(token_id=9, token=" dog", logprob=-1.5)],
    )  # fmt: skip
    ev = choice_event(2, DeltaEvent(token_ids=[7, 8], text=" cat sat", logprobs=[lp]))
    assert (ev.index, ev.text, ev.num_tokens, ev.finish_reason) == (2, " cat sat", 2, None)
    assert ev.logprobs[0].token == " cat" and ev.logprobs[0].top == [(" cat", -0.5), (" dog", -1.5)]


def test_finish_carries_reason_and_usage() -> None:
    usage = Usage(prompt_tokens=12, completion_tokens=3, cached_tokens=8)
    ev = choice_event(0, FinishEvent(finish_reason="stop", usage=usage))
    assert (ev.finish_reason, ev.prompt_tokens, ev.cached_tokens, ev.text) == ("stop", 12, 8, "")

"""Turn a replica's wire events into client-facing choice events.

The replica detokenizes and applies stop strings (see `loraplex.platform.tokenizing`), so
text and logprob token strings pass through as they come; this only reshapes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.platform.wire import DeltaEvent, FinishEvent


@dataclass
class TokenLogprob:
    """One generated token's logprob and its top alternatives (text, logprob)."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class ChoiceEvent:
    """New output of one choice: text, token count, logprobs, and the finish reason at the end."""

    index: int
    text: str = ""
    num_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None


def choice_event(index: int, event: DeltaEvent | FinishEvent) -> ChoiceEvent:
    """One replica event as a choice event."""
    if isinstance(event, FinishEvent):
        return ChoiceEvent(
            index,
            finish_reason=event.finish_reason,
            prompt_tokens=event.usage.prompt_tokens,
            cached_tokens=event.usage.cached_tokens,
        )
    logprobs = [
        TokenLogprob(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top])
        for lp in event.logprobs or ()
    ]
    return ChoiceEvent(index, event.text, len(event.token_ids), logprobs)

"""What the engine hands back: per-step deltas (for streaming) and finished results (offline)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestDelta:
    """One request's news from one engine step: new tokens, new text, and whether it ended."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    new_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass
class CompletionOutput:
    """One generated sequence of a prompt."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None


@dataclass
class RequestOutput:
    """The result for one prompt; `.text`, `.token_ids`, `.logprobs` and `.finish_reason`
    read the first (usually only) completion in `outputs`."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, float] | None] | None
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0

    @property
    def text(self) -> str:
        """Generated text of the first completion."""
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        """Generated token ids of the first completion."""
        return self.outputs[0].token_ids

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        """Per generated token, {token id: logprob} of the top-N (None unless asked)."""
        return self.outputs[0].logprobs

    @property
    def finish_reason(self) -> str | None:
        """ "stop", "length" or "abort"."""
        return self.outputs[0].finish_reason

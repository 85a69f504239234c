"""GrammarState: one request's llguidance matcher, advanced only by accepted output tokens."""

from __future__ import annotations

from typing import Any


class GrammarError(RuntimeError):
    """The matcher refused a token the masked sampler produced (a bug, not bad input)."""


class GrammarState:
    """A request's position in its grammar; lives on the `Request` beside its generator.

    Preemption by recompute keeps the output tokens, so the state stays right as it is: the
    recomputed prefill samples the next token under the same mask. A caller that drops
    output tokens calls `rollback` with how many."""

    def __init__(self, matcher: Any, key: str) -> None:
        self.matcher = matcher
        self.key = key
        self.num_accepted = 0

    def accept(self, token_id: int) -> None:
        """Advance past a sampled output token (raises GrammarError if the grammar refuses it)."""
        if not self.matcher.consume_token(token_id):
            raise GrammarError(f"grammar {self.key[:12]} refused token {token_id}: "
                               f"{self.matcher.get_error()}")  # fmt: skip
        self.num_accepted += 1

    def rollback(self, num_tokens: int) -> None:
        """Forget the last `num_tokens` accepted tokens (they were dropped from the output)."""
        if num_tokens > self.num_accepted or not self.matcher.rollback(num_tokens):
            raise GrammarError(f"cannot roll back {num_tokens} of {self.num_accepted} tokens")
        self.num_accepted -= num_tokens

    @property
    def is_finished(self) -> bool:
        """True once the grammar allows nothing more (it has consumed an end token)."""
        return bool(self.matcher.is_stopped())

    @property
    def is_accepting(self) -> bool:
        """True when the output so far is a complete match."""
        return bool(self.matcher.is_accepting())

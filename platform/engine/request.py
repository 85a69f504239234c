"""Request: the engine's state for one sequence, from arrival to finish."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.structured.state import GrammarState


class RequestStatus(enum.Enum):
    """Where a request is in its life; the FINISHED_* values are terminal."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        """True for a terminal status."""
        return self.value in ("stop", "length", "abort")

    @property
    def finish_reason(self) -> str | None:
        """ "stop", "length" or "abort" for a finished request, else None."""
        return self.value if self.finished else None


@dataclass
class Request:
    """One sequence: prompt and output tokens, KV blocks, progress and timings.

    `num_computed_tokens` counts tokens whose KV is in the cache; the tokens still to
    run are `all_token_ids[num_computed_tokens:]`. `adapter_key` (an adapter version's
    sha256) and `cache_salt` separate prefix-cache entries; `adapter` is an opaque
    handle for the LoRA runtime.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    adapter_key: str | None = None
    adapter: object | None = None
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    generator: torch.Generator | None = None
    grammar: GrammarState | None = None  # the structured-output matcher, when constrained
    # This step's draft tokens: run after the known tokens and verified (never output as such).
    spec_token_ids: list[int] = field(default_factory=list)
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("the prompt must have at least one token")

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by output tokens (a new list)."""
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens at positions [start, end) of prompt+output without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    @property
    def is_finished(self) -> bool:
        """True once stopped, length-capped or aborted."""
        return self.status.finished

    @property
    def wants_prompt_logprobs(self) -> bool:
        """True while prompt logprobs are requested and not all computed yet."""
        return (
            self.sampling_params.prompt_logprobs is not None
            and len(self.prompt_logprobs) < self.num_prompt_tokens
        )

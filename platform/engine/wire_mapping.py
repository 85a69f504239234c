"""Where the replica meets the wire: wire requests -> engine objects, engine deltas -> events.

The one place the wire's `SamplingOptions` becomes the engine's `SamplingParams` (whose
defaults and range checks are the only ones), and the one place a `RequestDelta` becomes the
`DeltaEvent` / `FinishEvent` frames of `/generate` (logprob token text rendered here, by the
tokenizing package, so the gateway never decodes tokens).
"""

from __future__ import annotations

from typing import Any, cast

from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.structured.spec import GrammarSpec
from loraplex.platform.tokenizing import token_text
from loraplex.platform.wire import (
    AdapterRef,
    DeltaEvent,
    FinishEvent,
    FinishReason,
    SamplingOptions,
    TokenLogprobs,
    TopLogprob,
    Usage,
    encode_event,
)


def sampling_params(options: SamplingOptions) -> SamplingParams:
    """The engine's SamplingParams for `options` (raises ValueError for a bad value); the
    structured-output constraint becomes the engine's `GrammarSpec` (compiled at admission)."""
    kwargs = options.engine_kwargs()
    wire = options.structured
    if wire is not None:
        kwargs["structured"] = GrammarSpec(wire.kind, wire.value, tuple(wire.choices or ()))
    return SamplingParams(**kwargs)


def adapter_reference(ref: AdapterRef | None) -> AdapterRef | None:
    """The engine's object-storage adapter reference for a wire `AdapterRef`: the wire model
    itself (its one definition; the fetcher adds the checks the field constraints cannot)."""
    return ref


def merge_deltas(deltas: list[RequestDelta]) -> RequestDelta:
    """One delta saying what `deltas` (one request's, in step order) said: tokens, text and
    logprobs concatenated, the first prompt logprobs, the last finish and counts. A replica
    that fell behind its engine sends the backlog as one frame instead of one per step."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return RequestDelta(
        last.request_id,
        [t for d in deltas for t in d.new_token_ids],
        "".join(d.new_text for d in deltas),
        [lp for d in deltas for lp in d.new_logprobs],
        next((d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None),
        last.finished,
        last.finish_reason,
        last.num_prompt_tokens,
        last.num_cached_tokens,
    )


class EventWriter:
    """Turns one request's engine deltas into SSE frames (counting its output tokens)."""

    def __init__(self, tokenizer: Any | None, top_n: int | None) -> None:
        self._tok = tokenizer
        self._top_n = top_n
        self.num_output_tokens = 0

    def _text(self, token_id: int) -> str:
        return "" if self._tok is None else token_text(self._tok, token_id)

    def _top(self, entry: dict[int, float], n: int) -> list[TopLogprob]:
        best = sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:n]
        return [TopLogprob(token_id=t, token=self._text(t), logprob=v) for t, v in best]

    def _logprobs(self, d: RequestDelta) -> list[TokenLogprobs] | None:
        if self._top_n is None or not d.new_logprobs:
            return None
        out = []
        for token_id, entry in zip(d.new_token_ids, d.new_logprobs, strict=True):
            out.append(
                TokenLogprobs(
                    token_id=token_id,
                    token=self._text(token_id),
                    logprob=entry[token_id],
                    top=self._top(entry, self._top_n),
                )
            )
        return out

    def frames(self, d: RequestDelta) -> list[bytes]:
        """The frames of one delta: a DeltaEvent when it carries output, then a FinishEvent
        when the request ended."""
        out = []
        self.num_output_tokens += len(d.new_token_ids)
        if d.new_token_ids or d.new_text or d.prompt_logprobs is not None:
            prompt_lps = None
            if d.prompt_logprobs is not None:
                prompt_lps = [
                    None if e is None else self._top(e, len(e)) for e in d.prompt_logprobs
                ]
            event = DeltaEvent(
                token_ids=d.new_token_ids,
                text=d.new_text,
                logprobs=self._logprobs(d),
                prompt_logprobs=prompt_lps,
            )
            out.append(encode_event(event))
        if d.finished:
            usage = Usage(
                prompt_tokens=d.num_prompt_tokens,
                completion_tokens=self.num_output_tokens,
                cached_tokens=d.num_cached_tokens,
            )
            # A finished request's reason is its RequestStatus value: "stop", "length", "abort"
            # (the strict model checks it again).
            reason = cast(FinishReason, d.finish_reason)
            out.append(encode_event(FinishEvent(finish_reason=reason, usage=usage)))
        return out

"""Turn a replica's token deltas into client-facing choice events: text (detokenized here),
stop strings applied, logprobs paired with token text.

Stop strings are enforced here whatever the replica does, holding back just enough text
that a stop sequence split across tokens is never streamed before it is recognised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.platform.gateway.assets import Detokenizer, ModelAssets
from loraplex.platform.gateway.replica_client import TokenDelta


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


class OutputProcessor:
    """Per-choice state: detokenizer, stop-string window, counts."""

    def __init__(
        self,
        assets: ModelAssets,
        index: int,
        stops: list[str],
        top_logprobs: int | None,
    ) -> None:
        self.assets = assets
        self.index = index
        self.stops = stops
        self.top_n = top_logprobs
        self._detok = Detokenizer(assets.tokenizer)
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._pending = ""
        self.stopped = False
        self.num_tokens = 0
        self.text = ""

    def _logprobs(self, delta: TokenDelta) -> list[TokenLogprob]:
        if self.top_n is None or delta.logprobs is None:
            return []
        out = []
        for token_id, entry in zip(delta.token_ids, delta.logprobs, strict=False):
            top = sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[: self.top_n]
            lp = entry.get(token_id, top[0][1] if top else 0.0)
            out.append(
                TokenLogprob(
                    self.assets.token_text(token_id),
                    lp,
                    [(self.assets.token_text(t), v) for t, v in top],
                )
            )
        return out

    def _emit(self, new_text: str, final: bool) -> tuple[str, bool]:
        """Add text to the window; return (text safe to send, whether a stop string hit)."""
        self._pending += new_text
        for stop in self.stops:
            at = self._pending.find(stop)
            if at >= 0:
                out = self._pending[:at]
                self._pending = ""
                return out, True
        if final or self._hold == 0:
            out, self._pending = self._pending, ""
            return out, False
        cut = max(len(self._pending) - self._hold, 0)
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def process(self, delta: TokenDelta) -> ChoiceEvent:
        """Fold one replica delta into a choice event (`finish_reason` set when done)."""
        if self.stopped:
            return ChoiceEvent(self.index)
        self.num_tokens += len(delta.token_ids)
        # Text is always decoded here (not taken from the replica) so stop strings, held-back
        # partial characters and logprob offsets all follow one decoding.
        new = self._detok.push(delta.token_ids)
        if delta.finish_reason is not None:
            new += self._detok.flush()
        text, hit = self._emit(new, final=delta.finish_reason is not None)
        finish = delta.finish_reason
        if hit:
            self.stopped = True
            finish = "stop"
        elif finish is not None:
            self.stopped = True
            if finish not in ("stop", "length"):
                finish = "stop" if finish != "abort" else "abort"
        self.text += text
        return ChoiceEvent(
            index=self.index,
            text=text,
            num_tokens=len(delta.token_ids),
            logprobs=self._logprobs(delta),
            finish_reason=finish,
            prompt_tokens=delta.num_prompt_tokens,
            cached_tokens=delta.num_cached_tokens,
        )

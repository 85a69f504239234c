"""The pieces of OpenAI chunks the endpoints write: logprob entries in each endpoint's shape,
and content chunks kept as encoded bytes around their text (`TextHoles`)."""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from typing import Any

from loraplex.platform.gateway import openai_schemas as oa
from loraplex.platform.tokenizing import display_bytes
from loraplex.platform.wire import DeltaEvent, TokenLogprobs


def chat_logprobs(logprobs: list[TokenLogprobs] | None) -> list[dict[str, Any]]:
    """Chat-style `logprobs.content` entries of some tokens."""
    return [
        oa.chat_logprobs_entry(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top])
        for lp in logprobs or ()
    ]


def text_logprobs(deltas: list[DeltaEvent], offset: int = 0) -> dict[str, Any]:
    """Completions-style logprobs of some deltas (`text_offset` counted from `offset`)."""
    out: dict[str, Any] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    pos = offset
    chars = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for delta in deltas:
        for lp in delta.logprobs or ():
            out["tokens"].append(lp.token)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({t.token: t.logprob for t in lp.top})
            out["text_offset"].append(pos)
            # offsets count characters of the text: a token that is part of a character
            # moves the offset only once the character is complete
            pos += len(chars.decode(display_bytes(lp.token)))
    return out


_HOLE = "\x00text\x00"
_HOLE_JSON = json.dumps(_HOLE).encode()


class TextHoles:
    """A stream's content chunk per choice as encoded bytes around the text: built once by the
    same chunk builder and encoder as every other chunk (so the bytes are identical), then
    filled with each new text (the common frame: new text, no logprobs, no finish). The
    builder comes with each call, not kept: a writer keeping this and this keeping the
    writer's method was a reference cycle per stream, the whole job freed only by a full
    collection (a pause on the event loop)."""

    def __init__(self) -> None:
        self._parts: dict[int, tuple[bytes, bytes]] = {}

    def fill(self, index: int, text: str, build: Callable[[int, str], bytes]) -> bytes:
        """Choice `index`'s content chunk for `text`; `build(index, text)` makes the chunk
        the first time (its bytes around the text are kept)."""
        parts = self._parts.get(index)
        if parts is None:
            head, tail = build(index, _HOLE).split(_HOLE_JSON)
            parts = self._parts[index] = (head, tail)
        return parts[0] + json.dumps(text).encode() + parts[1]

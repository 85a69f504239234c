"""Incremental detokenization with stop strings, and how a token reads in logprobs.

Decoding token by token is wrong for byte-level and sentencepiece tokenizers (a character
may span tokens, a leading space depends on the previous token). Two ways, each O(1) work per
token whatever the output:
- byte-level BPE (decoding is exactly the tokens' bytes joined): the bytes go through an
  incremental UTF-8 decoder, which holds back a character still forming and replaces bytes
  that can never form one (U+FFFD), exactly as decoding the whole sequence would;
- any other tokenizer: each step decodes a short window of recent tokens and emits only the
  text that grew past the previous window, holding back incomplete characters (U+FFFD). A
  window that has not completed a character in `MAX_PENDING` tokens holds no character still
  forming (none spans that many tokens), so it is emitted as decoded: output that never forms
  a character (a tenant can steer its adapter to such tokens) cannot make each token decode
  the whole tail again inside the engine step every tenant shares. Stop strings are searched in the new text only; while a
request runs, the last `len(longest stop) - 1` characters are held back so a stop string that
is still forming is never streamed. The sequence ends on the token that completes a stop
string, and its text is cut exactly there (or just after it, with
`include_stop_str_in_output`).
"""

from __future__ import annotations

import codecs
from typing import Protocol, runtime_checkable

from loraplex.platform.tokenizing.token_bytes import display_token

PROMPT_CONTEXT = 5
MAX_PENDING = 8  # tokens; a UTF-8 character spans at most 4 bytes, so at most 4 tokens


class Decoder(Protocol):
    """Anything with `decode(ids, skip_special_tokens)` (a `ModelTokenizer`)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ids."""
        ...


class ByteSource(Protocol):
    """Anything with `token_bytes(id)` (a `ModelTokenizer`)."""

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token."""
        ...


@runtime_checkable
class ByteDecodable(Protocol):
    """A tokenizer that can say when its decoding is its tokens' bytes joined."""

    @property
    def decodes_by_bytes(self) -> bool:
        """True for byte-level BPE."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token."""
        ...

    def is_special(self, token_id: int) -> bool:
        """Whether the token is special (dropped by `skip_special_tokens`)."""
        ...


def token_text(tokenizer: ByteSource, token_id: int) -> str:
    """How one token reads in logprobs: its text alone (special tokens included), or
    `bytes:\\xNN...` when it is part of a UTF-8 character (see `token_bytes.py`)."""
    return display_token(tokenizer.token_bytes(token_id))


class IncrementalDetokenizer:
    """Turns one request's output tokens into text as they arrive; finds stop strings."""

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: list[int],
        stop: list[str],
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.skip_special = skip_special_tokens
        self.ids = list(prompt_token_ids[-PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.emitted = 0
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.stopped = False
        self._bytes: ByteDecodable | None = (
            tokenizer
            if isinstance(tokenizer, ByteDecodable) and tokenizer.decodes_by_bytes
            else None
        )
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> bool:
        """Append one token's text; True when a stop string ended the output (text cut there)."""
        if self.stopped:
            return True
        if self._bytes is not None:
            return self._add_bytes(self._bytes, token_id)
        self.ids.append(token_id)
        dec = self.tokenizer.decode
        before = dec(self.ids[self.prefix_offset : self.read_offset], self.skip_special)
        after = dec(self.ids[self.prefix_offset :], self.skip_special)
        pending = len(self.ids) - self.read_offset
        if len(after) > len(before) and (not after.endswith("\ufffd") or pending >= MAX_PENDING):
            old_len = len(self.text)
            self.text += after[len(before) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return self._check_stop(old_len)
        return False

    def _add_bytes(self, tok: ByteDecodable, token_id: int) -> bool:
        if self.skip_special and tok.is_special(token_id):
            return False
        piece = self._utf8.decode(tok.token_bytes(token_id))
        if not piece:
            return False
        old_len = len(self.text)
        self.text += piece
        return self._check_stop(old_len)

    def _check_stop(self, old_len: int) -> bool:
        if not self.stop:
            return False
        begin = max(0, old_len - self.holdback)
        best = None
        for s in self.stop:
            i = self.text.find(s, begin)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return False
        i, s = best
        self.text = self.text[: i + len(s)] if self.include_stop else self.text[:i]
        self.stopped = True
        return True

    def _flush(self) -> None:
        """At the end, text still held for an incomplete character is added as decoded
        (U+FFFD for bytes that never completed one)."""
        if self._bytes is not None:
            if not self.stopped:
                old_len = len(self.text)
                self.text += self._utf8.decode(b"", final=True)
                self._check_stop(old_len)
            return
        if self.stopped or self.read_offset == len(self.ids):
            return
        dec = self.tokenizer.decode
        before = dec(self.ids[self.prefix_offset : self.read_offset], self.skip_special)
        after = dec(self.ids[self.prefix_offset :], self.skip_special)
        self.read_offset = len(self.ids)
        if len(after) > len(before):
            old_len = len(self.text)
            self.text += after[len(before) :]
            self._check_stop(old_len)

    def take_new_text(self, finished: bool) -> str:
        """Text not yet handed out; while running, withholds a possible stop-string prefix
        and any incomplete character."""
        if finished:
            self._flush()
        end = len(self.text) if finished or self.stopped else len(self.text) - self.holdback
        if end <= self.emitted:
            return ""
        out = self.text[self.emitted : end]
        self.emitted = end
        return out

"""The raw bytes of one token, and how a token reads in logprobs (OpenAI's `bytes:\\xNN`).

A byte-level BPE token may be part of a UTF-8 character (`日` is three byte tokens when no
merge covers it). Decoding such a token alone gives U+FFFD, so every partial token would read
the same and `top_logprobs` keyed by text would collapse them (ask for 5, get 3). OpenAI
shows a token that is not valid UTF-8 as `bytes:` followed by `\\xNN` escapes of its bytes;
`display_token` does that, and `display_bytes` is its exact inverse (the gateway fills the
chat `bytes` field from it without a tokenizer). A valid token whose text itself starts with
`bytes:` is shown in the escaped form too, so the two forms can never be confused.

Where the bytes come from (`TokenBytes`, built once per tokenizer):
- a token that decodes alone without U+FFFD: its text, UTF-8 encoded;
- a `ByteLevel` decoder (GPT-2 style vocabularies): each character of the vocabulary string
  maps back to one byte through the inverse of the byte-to-unicode table;
- a `ByteFallback` decoder (sentencepiece style): `<0xNN>` tokens are that one byte;
- otherwise the decoded text (the tokenizer gives no way to its bytes).
"""

from __future__ import annotations

import json
import re
from typing import Any

BYTES_PREFIX = "bytes:"
_ESCAPED = re.compile(r"(?:\\x[0-9a-f]{2})+")
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_table() -> dict[str, int]:
    """Vocabulary character -> byte for byte-level BPE (printable bytes keep their code
    point; the others take 256, 257, ... in byte order)."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    table = {chr(b): b for b in keep}
    shifted = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_BYTE_LEVEL = _byte_level_table()


def display_token(raw: bytes) -> str:
    """How a token with bytes `raw` reads in logprobs: its text, or `bytes:\\xNN...` when it
    is not valid UTF-8 (or its text could be mistaken for that form)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not text.startswith(BYTES_PREFIX):
        return text
    return BYTES_PREFIX + "".join(f"\\x{b:02x}" for b in raw)


def display_bytes(token: str) -> bytes:
    """The bytes of a token as `display_token` showed it (its exact inverse)."""
    rest = token[len(BYTES_PREFIX) :]
    if token.startswith(BYTES_PREFIX) and _ESCAPED.fullmatch(rest):
        return bytes(int(rest[i + 2 : i + 4], 16) for i in range(0, len(rest), 4))
    return token.encode("utf-8")


def _decoder_types(spec: Any) -> set[str]:
    """The decoder types of a serialized tokenizer's `decoder` (sequences flattened)."""
    if not isinstance(spec, dict):
        return set()
    found = {str(spec.get("type"))}
    for inner in spec.get("decoders") or ():
        found |= _decoder_types(inner)
    return found


class TokenBytes:
    """The raw bytes of each token id of one `tokenizers.Tokenizer` (computed lazily, cached)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._cache: dict[int, bytes] = {}
        kinds = _decoder_types(json.loads(tokenizer.to_str()).get("decoder"))
        self._byte_level = "ByteLevel" in kinds
        self._byte_fallback = "ByteFallback" in kinds
        # Decoding a sequence is exactly its tokens' bytes joined (invalid UTF-8 replaced)
        # only when ByteLevel is the whole decoder: then text can be decoded byte by byte.
        self.concatenates = kinds == {"ByteLevel"}
        self._special = {
            tid for tid, added in tokenizer.get_added_tokens_decoder().items() if added.special
        }

    def is_special(self, token_id: int) -> bool:
        """Whether `token_id` is a special token (dropped by `skip_special_tokens`)."""
        return token_id in self._special

    def __call__(self, token_id: int) -> bytes:
        """Bytes of `token_id` (special tokens as their text)."""
        raw = self._cache.get(token_id)
        if raw is None:
            raw = self._compute(token_id)
            self._cache[token_id] = raw
        return raw

    def _compute(self, token_id: int) -> bytes:
        text = self._tok.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text.encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return text.encode("utf-8")
        if self._byte_level and all(c in _BYTE_LEVEL for c in piece):
            return bytes(_BYTE_LEVEL[c] for c in piece)
        if self._byte_fallback:
            match = _BYTE_FALLBACK.fullmatch(piece)
            if match:
                return bytes([int(match.group(1), 16)])
        return text.encode("utf-8")

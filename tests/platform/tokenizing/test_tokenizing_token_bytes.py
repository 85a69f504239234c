"""Logprob token strings on a real byte-level BPE: tokens that are part of a UTF-8 character
read as OpenAI's `bytes:\\xNN` (distinct keys), and the form converts back to the exact bytes."""

from __future__ import annotations

import pytest
from support.byte_bpe import byte_level_tokenizer, byte_tokens

from loraplex.platform.tokenizing import ModelTokenizer, display_bytes, display_token, token_text


@pytest.fixture(scope="module")
def tok() -> ModelTokenizer:
    return byte_level_tokenizer()


def test_partial_utf8_tokens_read_as_distinct_bytes_forms(tok: ModelTokenizer) -> None:
    text = "日本語🙂"
    ids = byte_tokens(tok, text)
    assert all(tok.decode([i]) == "\ufffd" for i in ids)  # what decoding alone shows
    shown = [token_text(tok, i) for i in ids]
    raw = text.encode("utf-8")
    assert shown == [f"bytes:\\x{b:02x}" for b in raw]
    assert len(set(shown)) == len(set(raw))
    assert b"".join(display_bytes(s) for s in shown) == raw


def test_whole_tokens_read_as_their_text(tok: ModelTokenizer) -> None:
    ids = tok.encode("hello wörld")
    assert "".join(token_text(tok, i) for i in ids) == "hello wörld"
    assert token_text(tok, 1) == "</s>"
    assert b"".join(tok.token_bytes(i) for i in ids) == "hello wörld".encode()


@pytest.mark.parametrize(
    "raw",
    [b"abc", "é".encode(), b"\xe6", b"\xe6\x97", b"bytes:\\x41", b"bytes:", b"\xff\x00"],
)
def test_display_form_round_trips(raw: bytes) -> None:
    shown = display_token(raw)
    assert display_bytes(shown) == raw
    if raw.startswith(b"bytes:") or raw in (b"\xe6", b"\xe6\x97", b"\xff\x00"):
        assert shown.startswith("bytes:\\x")
    else:
        assert shown == raw.decode()

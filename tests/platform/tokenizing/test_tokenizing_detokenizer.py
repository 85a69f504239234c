"""Incremental detokenization on a byte-level BPE (multi-byte characters split over tokens),
stop strings cut exactly, and the logprob text of one token."""

from __future__ import annotations

import pytest
from support.byte_bpe import byte_level_tokenizer, byte_tokens

from loraplex.platform.tokenizing import IncrementalDetokenizer, ModelTokenizer, token_text

TEXT = "héllo wörld 🙂 日本語 and the end. hello world again 🙂!"


@pytest.fixture(scope="module")
def tok() -> ModelTokenizer:
    return byte_level_tokenizer()


def stream(tok: ModelTokenizer, ids: list[int], **kw: object) -> tuple[list[str], bool]:
    d = IncrementalDetokenizer(tok, tok.encode("prompt: "), **kw)
    pieces, stopped = [], False
    for t in ids:
        stopped = d.add(t)
        pieces.append(d.take_new_text(stopped))
        if stopped:
            break
    if not stopped:
        pieces.append(d.take_new_text(True))
    return pieces, stopped


def test_incremental_text_equals_full_decode(tok: ModelTokenizer) -> None:
    ids = tok.encode(TEXT)
    assert len(ids) > len(TEXT) // 3  # multi-byte characters really are split
    pieces, stopped = stream(tok, ids, stop=[])
    assert not stopped
    assert "".join(pieces) == tok.decode(ids) == TEXT
    assert not any("\ufffd" in p for p in pieces)


def test_special_tokens_skipped_or_kept(tok: ModelTokenizer) -> None:
    ids = tok.encode("hello") + [1]
    assert "".join(stream(tok, ids, stop=[])[0]) == "hello"
    kept = stream(tok, ids, stop=[], skip_special_tokens=False)[0]
    assert "".join(kept) == "hello</s>"


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_and_never_streams_a_partial_stop(
    tok: ModelTokenizer, include: bool
) -> None:
    ids = tok.encode(TEXT)
    pieces, stopped = stream(tok, ids, stop=["日本", "zzz"], include_stop_str_in_output=include)
    assert stopped
    cut = TEXT.index("日本")
    assert "".join(pieces) == TEXT[: cut + (2 if include else 0)]
    streamed_before_stop = "".join(pieces[:-1])
    assert "日" not in streamed_before_stop


def test_stop_string_spanning_tokens(tok: ModelTokenizer) -> None:
    ids = tok.encode(TEXT)
    pieces, stopped = stream(tok, ids, stop=["d 🙂 日"])
    assert stopped and "".join(pieces) == TEXT[: TEXT.index("d 🙂 日")]


def test_token_text_keeps_special_tokens(tok: ModelTokenizer) -> None:
    assert token_text(tok, 1) == tok.token_text(1) == "</s>"
    ids = tok.encode("hello")
    assert "".join(token_text(tok, t) for t in ids) == "hello"


def test_partial_characters_are_held_back_until_complete(tok: ModelTokenizer) -> None:
    ids = byte_tokens(tok, "日本")  # six tokens, one byte each
    pieces, _ = stream(tok, ids, stop=[])
    assert pieces == ["", "", "日", "", "", "本", ""]


def test_bytes_that_never_complete_a_character_are_flushed_at_the_end(
    tok: ModelTokenizer,
) -> None:
    ids = byte_tokens(tok, "日")[:2] + tok.encode("!")
    pieces, _ = stream(tok, ids, stop=[])
    assert pieces[:2] == ["", ""] and pieces[2].endswith("!") and "\ufffd" in pieces[2]
    unfinished = byte_tokens(tok, "日")[:2]
    pieces, _ = stream(tok, unfinished, stop=[])
    assert pieces[:2] == ["", ""] and pieces[2] and set(pieces[2]) == {"\ufffd"}

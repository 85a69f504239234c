"""Incremental detokenization on a byte-level BPE (multi-byte characters split over tokens)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from loraplex.platform.engine.detokenizer import IncrementalDetokenizer
from loraplex.platform.engine.hf_tokenizer import HFTokenizer

TEXT = "héllo wörld 🙂 日本語 and the end. hello world again 🙂!"


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
    )
    t.train_from_iterator(["hello world and the end", "héllo wörld again"] * 20, trainer)
    return HFTokenizer(tokenizer=t, eos_token="</s>", eos_token_ids=[1])


def stream(tok: HFTokenizer, ids: list[int], **kw: object) -> tuple[list[str], bool]:
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


def test_incremental_text_equals_full_decode(tok: HFTokenizer) -> None:
    ids = tok.encode(TEXT)
    assert len(ids) > len(TEXT) // 3  # multi-byte characters really are split
    pieces, stopped = stream(tok, ids, stop=[])
    assert not stopped
    assert "".join(pieces) == tok.decode(ids) == TEXT
    assert not any("\ufffd" in p for p in pieces)


def test_special_tokens_skipped_or_kept(tok: HFTokenizer) -> None:
    ids = tok.encode("hello") + [1]
    assert "".join(stream(tok, ids, stop=[])[0]) == "hello"
    kept = stream(tok, ids, stop=[], skip_special_tokens=False)[0]
    assert "".join(kept) == "hello</s>"


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_and_never_streams_a_partial_stop(tok: HFTokenizer, include: bool) -> None:
    ids = tok.encode(TEXT)
    pieces, stopped = stream(tok, ids, stop=["日本", "zzz"], include_stop_str_in_output=include)
    assert stopped
    cut = TEXT.index("日本")
    assert "".join(pieces) == TEXT[: cut + (2 if include else 0)]
    streamed_before_stop = "".join(pieces[:-1])
    assert "日" not in streamed_before_stop


def test_stop_string_spanning_tokens(tok: HFTokenizer) -> None:
    ids = tok.encode(TEXT)
    pieces, stopped = stream(tok, ids, stop=["d 🙂 日"])
    assert stopped and "".join(pieces) == TEXT[: TEXT.index("d 🙂 日")]

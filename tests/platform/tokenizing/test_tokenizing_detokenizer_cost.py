"""The incremental detokenizer's work per token is bounded: output that never completes a UTF-8
character (lone continuation bytes, which a tenant's own adapter can steer a model to) must
not make each new token decode the whole tail again (quadratic work in the shared engine
step). Work is counted in tokens handed to `decode`, not in seconds."""

from __future__ import annotations

import pytest
from support.byte_bpe import (
    CountingDecoder,
    WindowOnlyDecoder,
    byte_level_tokenizer,
    lone_continuation_byte,
)

from loraplex.platform.tokenizing import IncrementalDetokenizer, ModelTokenizer
from loraplex.platform.tokenizing.detokenizer import ByteDecodable

N_TOKENS = 8192


@pytest.fixture(scope="module")
def tok() -> ModelTokenizer:
    return byte_level_tokenizer()


def _run(tok: ModelTokenizer, ids: list[int]) -> tuple[str, int]:
    counting = CountingDecoder(tok)
    d = IncrementalDetokenizer(counting, tok.encode("prompt: "), stop=["END"])
    pieces = []
    for t in ids:
        d.add(t)
        pieces.append(d.take_new_text(False))
    pieces.append(d.take_new_text(True))
    return "".join(pieces), counting.decoded_tokens


def test_8k_lone_continuation_bytes_cost_linear_work(tok: ModelTokenizer) -> None:
    cont = lone_continuation_byte(tok)
    text, work = _run(tok, [cont] * N_TOKENS)
    assert text == tok.decode([cont] * N_TOKENS)  # every byte shown as U+FFFD, none lost
    # Linear: a bounded window per token (today: ~N^2/2 = 33M tokens decoded).
    assert work <= 64 * N_TOKENS, work


def test_garbage_then_valid_text_still_decodes_exactly(tok: ModelTokenizer) -> None:
    cont = lone_continuation_byte(tok)
    tail = tok.encode("héllo wörld 🙂 and 日本語", add_special_tokens=False)
    ids = [cont] * 300 + tail + [cont] * 5 + tail
    text, work = _run(tok, ids)
    assert text == tok.decode(ids)
    assert work <= 64 * len(ids), work


def test_stop_string_after_garbage_still_cuts(tok: ModelTokenizer) -> None:
    cont = lone_continuation_byte(tok)
    ids = [cont] * 50 + tok.encode("hello END world", add_special_tokens=False)
    counting = CountingDecoder(tok)
    d = IncrementalDetokenizer(counting, [], stop=["END"])
    stopped = False
    for t in ids:
        stopped = d.add(t)
        if stopped:
            break
    assert stopped
    assert d.take_new_text(True) == tok.decode([cont] * 50) + "hello "


def test_windowed_path_is_bounded_too(tok: ModelTokenizer) -> None:
    cont = lone_continuation_byte(tok)
    window = WindowOnlyDecoder(tok)
    d = IncrementalDetokenizer(window, tok.encode("prompt: "), stop=[])
    for t in [cont] * N_TOKENS:
        d.add(t)
    text = d.take_new_text(True)
    assert text == tok.decode([cont] * N_TOKENS)
    assert window.decoded_tokens <= 64 * N_TOKENS, window.decoded_tokens
    assert isinstance(tok, ByteDecodable) and tok.decodes_by_bytes  # the other test's path

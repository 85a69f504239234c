"""Top logprobs from the replica to the client when the candidates are byte-level tokens that
are each part of a UTF-8 character: ask for 5, get 5 (keys stay distinct), with their bytes."""

from __future__ import annotations

from support.byte_bpe import byte_level_tokenizer, byte_tokens

from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.wire_mapping import EventWriter
from loraplex.platform.gateway.chunk_parts import chat_logprobs, text_logprobs
from loraplex.platform.wire import DeltaEvent, decode_event


def test_five_partial_byte_candidates_stay_five_end_to_end() -> None:
    tok = byte_level_tokenizer()
    ids = byte_tokens(tok, "日本語")  # nine tokens, one byte each; five distinct bytes first
    candidates = list(dict.fromkeys(ids))[:5]
    assert len(candidates) == 5
    chosen = candidates[0]
    entry = {t: -0.1 * (k + 1) for k, t in enumerate(candidates)}
    entry[tok.encode("hello")[0]] = -9.0  # a sixth, worse candidate
    writer = EventWriter(tok, top_n=5)
    frames = writer.frames(RequestDelta("r", new_token_ids=[chosen], new_logprobs=[entry]))
    event = decode_event(frames[0].split(b"data: ", 1)[1].strip())
    assert isinstance(event, DeltaEvent)
    completions = text_logprobs([event])
    top = completions["top_logprobs"][0]
    assert len(top) == 5
    assert completions["tokens"] == [f"bytes:\\x{tok.token_bytes(chosen)[0]:02x}"]

    (chat_entry,) = chat_logprobs(event.logprobs)
    assert chat_entry["bytes"] == list(tok.token_bytes(chosen))
    assert [c["bytes"] for c in chat_entry["top_logprobs"]] == [
        list(tok.token_bytes(t)) for t in candidates
    ]
    assert len({c["token"] for c in chat_entry["top_logprobs"]}) == 5


def test_text_offsets_count_characters_not_byte_tokens() -> None:
    tok = byte_level_tokenizer()
    ids = tok.encode("a日b", add_special_tokens=False)
    writer = EventWriter(tok, top_n=0)
    delta = RequestDelta("r", new_token_ids=ids, new_logprobs=[{i: -0.5} for i in ids])
    event = decode_event(writer.frames(delta)[0].split(b"data: ", 1)[1].strip())
    assert isinstance(event, DeltaEvent)
    out = text_logprobs([event])
    # a, then three byte tokens of 日 (all at offset 1), then b at offset 2
    assert out["text_offset"] == [0, 1, 1, 1, 2]

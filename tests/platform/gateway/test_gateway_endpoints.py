"""The endpoint kinds write OpenAI chunks straight from the replica's wire events: the replica
detokenizes and applies stop strings, so text and logprob token strings pass through
unchanged; a finish writes the finish chunk; chat opens with a role chunk per choice."""

from __future__ import annotations

import json
import uuid

from loraplex.platform.gateway.completion import Job
from loraplex.platform.gateway.endpoints import CHAT, TEXT, Endpoint
from loraplex.platform.wire import (
    DeltaEvent,
    GenerateRequest,
    SamplingOptions,
    TokenLogprobs,
    TopLogprob,
)

LP = TokenLogprobs(
    token_id=7,
    token=" cat",
    logprob=-0.5,
    top=[TopLogprob(token_id=7, token=" cat", logprob=-0.5),
         TopLogprob(token_id=9, token=" dog", logprob=-1.5)],
)  # fmt: skip


def _job(endpoint: Endpoint, n: int = 1, top_n: int | None = 2) -> Job:
    wire = GenerateRequest(request_id="x-1-0", prompt_token_ids=[1, 2], sampling=SamplingOptions())
    return Job(
        endpoint, "m", None, wire, 8, n, top_n, uuid.uuid4(), None,  # type: ignore[arg-type]  # no resolution needed to write chunks
        True, False, cid="x-1",
    )  # fmt: skip


def _chunks(raw: bytes) -> list[dict]:
    return [json.loads(f[6:]) for f in raw.split(b"\n\n") if f]


def test_chat_delta_passes_text_and_logprobs_through() -> None:
    writer = CHAT.stream_writer(_job(CHAT, n=2))
    assert [c["choices"][0]["delta"] for c in _chunks(writer.opening())] == [
        {"role": "assistant", "content": ""}
    ] * 2
    (chunk,) = _chunks(
        writer.frame(1, DeltaEvent(token_ids=[7, 8], text=" cat sat", logprobs=[LP]), None)
    )
    choice = chunk["choices"][0]
    assert (choice["index"], choice["delta"], choice["finish_reason"]) == (
        1,
        {"content": " cat sat"},
        None,
    )
    (entry,) = choice["logprobs"]["content"]
    assert entry["token"] == " cat"
    assert [(t["token"], t["logprob"]) for t in entry["top_logprobs"]] == [
        (" cat", -0.5),
        (" dog", -1.5),
    ]
    (done,) = _chunks(writer.frame(1, None, "stop"))
    assert done["choices"][0]["finish_reason"] == "stop" and done["choices"][0]["delta"] == {}


def test_text_chunks_carry_offsets_across_a_choice() -> None:
    writer = TEXT.stream_writer(_job(TEXT))
    assert writer.opening() == b""
    first = _chunks(writer.frame(0, DeltaEvent(token_ids=[7], text=" cat", logprobs=[LP]), None))[0]
    second = _chunks(writer.frame(0, DeltaEvent(token_ids=[7], text=" cat", logprobs=[LP]), None))[
        0
    ]
    assert first["choices"][0]["text"] == " cat"
    assert first["choices"][0]["logprobs"]["text_offset"] == [0]
    assert second["choices"][0]["logprobs"]["text_offset"] == [4]
    assert second["choices"][0]["logprobs"]["top_logprobs"] == [{" cat": -0.5, " dog": -1.5}]
    assert writer.frame(0, DeltaEvent(token_ids=[], text=""), None) == b""


TEXTS = ["hi", " cat", "日本語", 'a "quote"\n', "\x00", "\u2028", "\\", "🙂"]


def test_content_chunks_are_the_bytes_the_chunk_builder_writes() -> None:
    """The common frame (new text only) is written from bytes kept around the text: for any
    text they are exactly what the chunk builder and the SSE encoder write."""
    from loraplex.platform.gateway import openai_schemas as oa
    from loraplex.platform.gateway.streaming import sse

    for usage in (False, True):
        for endpoint in (CHAT, TEXT):
            job = _job(endpoint, n=2, top_n=None)
            job.include_usage = usage
            writer = endpoint.stream_writer(job)
            for index in (0, 1):
                for text in TEXTS:
                    got = writer.frame(index, DeltaEvent(token_ids=[1], text=text), None)
                    if endpoint is CHAT:
                        want = oa.chat_chunk(job.cid, job.created, job.model, index,
                                             {"content": text}, with_usage_field=usage)  # fmt: skip
                    else:
                        want = oa.text_chunk(job.cid, job.created, job.model, index, text,
                                             with_usage_field=usage)  # fmt: skip
                    assert got == sse(want), (endpoint.name, text)


def test_a_stream_writer_is_freed_without_the_collector() -> None:
    """A writer and its job go when the stream ends, by reference counting: a writer that
    kept a lambda over itself (for its chunk template) was a cycle per stream, the whole job
    left for a full collection, a pause on the event loop."""
    import gc
    import weakref

    for endpoint in (CHAT, TEXT):
        job = _job(endpoint, top_n=None)
        writer = endpoint.stream_writer(job)
        writer.opening()
        writer.frame(0, DeltaEvent(token_ids=[7], text=" cat"), None)
        writer.frame(0, DeltaEvent(token_ids=[8], text=" sat"), None)
        gone = weakref.ref(writer)
        enabled = gc.isenabled()
        gc.disable()
        try:
            del writer
            assert gone() is None, endpoint
        finally:
            if enabled:
                gc.enable()

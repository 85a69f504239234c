"""The gateway's reading of a replica's `/generate` stream: frames that arrive in one read
(a replica's backlog, or TCP joining writes) become one delta event carrying all their tokens,
text and logprobs in order; frames split across reads are reassembled; a malformed frame is
still a protocol error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from loraplex.platform.gateway.replica_client import ReplicaClient, ReplicaUnavailable
from loraplex.platform.wire import (
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    DeltaEvent,
    FinishEvent,
    GenerateRequest,
    TokenLogprobs,
    Usage,
    encode_event,
)


def _delta(i: int) -> DeltaEvent:
    lp = TokenLogprobs(token_id=i, token=f"t{i}", logprob=-0.1 * i, top=[])
    return DeltaEvent(token_ids=[i], text=f"<{i}>", logprobs=[lp])


FINISH = FinishEvent(
    finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=4, cached_tokens=0)
)


class _Body(httpx.AsyncByteStream):
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.reads:
            await asyncio.sleep(0)
            yield chunk


def _client(reads: list[bytes]) -> ReplicaClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            headers={WIRE_VERSION_HEADER: str(WIRE_VERSION), "content-type": "text/event-stream"},
            stream=_Body(reads),
        )

    return ReplicaClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)), "s")


async def _events(reads: list[bytes]) -> list[DeltaEvent | FinishEvent]:
    client = _client(reads)
    req = GenerateRequest(request_id="r", prompt_token_ids=[1, 2, 3])
    return [e async for e in client.generate("http://replica", req)]


def test_frames_of_one_read_become_one_delta() -> None:
    one_read = b"".join(encode_event(_delta(i)) for i in range(1, 4)) + encode_event(FINISH)
    events = asyncio.run(_events([one_read]))
    assert [type(e) for e in events] == [DeltaEvent, FinishEvent]
    delta = events[0]
    assert isinstance(delta, DeltaEvent)
    assert delta.token_ids == [1, 2, 3]
    assert delta.text == "<1><2><3>"
    assert [lp.token for lp in delta.logprobs or []] == ["t1", "t2", "t3"]


def test_frames_split_across_reads_are_reassembled() -> None:
    stream = b"".join(encode_event(_delta(i)) for i in range(1, 4)) + encode_event(FINISH)
    reads = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    events = asyncio.run(_events(reads))
    deltas = [e for e in events if isinstance(e, DeltaEvent)]
    assert [t for d in deltas for t in d.token_ids] == [1, 2, 3]
    assert "".join(d.text for d in deltas) == "<1><2><3>"
    assert isinstance(events[-1], FinishEvent)


def test_a_malformed_frame_is_a_protocol_error() -> None:
    with pytest.raises(ReplicaUnavailable, match="protocol error"):
        asyncio.run(_events([encode_event(_delta(1)) + b"event: nope\n\n"]))

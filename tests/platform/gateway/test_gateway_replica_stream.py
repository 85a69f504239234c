"""The gateway's reading of a replica's `/generate` stream: frames that arrive in one read
(a replica's backlog, or TCP joining writes) become one delta event carrying all their tokens,
text and logprobs in order; frames split across reads are reassembled; a malformed frame is
still a protocol error."""

from __future__ import annotations

import asyncio

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


async def _serve(reads: list[bytes], port_box: list[int], done: asyncio.Event) -> None:
    """A real HTTP server answering one `/generate` with `reads`, each sent as one HTTP chunk
    (pausing between them, so each arrives as a read of its own)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )  # fmt: skip
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + f"{WIRE_VERSION_HEADER}: {WIRE_VERSION}\r\n".encode()
            + b"transfer-encoding: chunked\r\n\r\n"
        )
        for chunk in reads:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port_box.append(server.sockets[0].getsockname()[1])
    async with server:
        await done.wait()


async def _events(reads: list[bytes]) -> list[DeltaEvent | FinishEvent]:
    port: list[int] = []
    done = asyncio.Event()
    server = asyncio.ensure_future(_serve(reads, port, done))
    while not port:
        await asyncio.sleep(0.001)
    async with httpx.AsyncClient() as http:
        client = ReplicaClient(http, "s")
        req = GenerateRequest(request_id="r", prompt_token_ids=[1, 2, 3])
        try:
            return [e async for e in client.generate(f"http://127.0.0.1:{port[0]}", req)]
        finally:
            done.set()
            await server


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

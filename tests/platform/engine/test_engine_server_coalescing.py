"""The replica's `/generate` stream sends what accumulated while it was busy as one frame:
several engine steps' deltas queued for one request become one `DeltaEvent` (tokens, text and
logprobs concatenated in order), so a loaded replica writes, and the gateway relays, fewer
frames with the same content."""

from __future__ import annotations

import asyncio

from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.server import _sse
from loraplex.platform.engine.wire_mapping import EventWriter
from loraplex.platform.wire import DeltaEvent, FinishEvent, decode_event


class _Loop:
    """What `_sse` needs of an EngineLoop: abort (never called for a stream that finished)."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, rid: str) -> bool:
        self.aborted.append(rid)
        return True


def _deltas() -> list[RequestDelta]:
    return [
        RequestDelta("r", [5], "a", [{5: -0.1, 6: -2.0}]),
        RequestDelta("r", [6], "b", [{6: -0.2, 5: -1.5}]),
        RequestDelta("r", [7, 8], "cd", [{7: -0.3}, {8: -0.4}]),
        RequestDelta(
            "r",
            [9],
            "e",
            [{9: -0.5}],
            finished=True,
            finish_reason="length",
            num_prompt_tokens=4,
            num_cached_tokens=2,
        ),  # fmt: skip
    ]


async def _frames(queued: list[RequestDelta]) -> list[bytes]:
    queue: asyncio.Queue = asyncio.Queue()
    for d in queued:
        queue.put_nowait(d)
    loop = _Loop()
    out = [f async for f in _sse(loop, "r", queue, EventWriter(None, None))]  # type: ignore[arg-type]  # a stand-in loop
    assert loop.aborted == []
    return out


def test_queued_deltas_leave_as_one_delta_and_one_finish_frame() -> None:
    frames = asyncio.run(_frames(_deltas()))
    events = [decode_event(f.removeprefix(b"data: ")) for f in b"".join(frames).split(b"\n\n") if f]
    assert [type(e) for e in events] == [DeltaEvent, FinishEvent]
    delta, finish = events
    assert isinstance(delta, DeltaEvent) and isinstance(finish, FinishEvent)
    assert delta.token_ids == [5, 6, 7, 8, 9]
    assert delta.text == "abcde"
    assert finish.finish_reason == "length"
    assert finish.usage.completion_tokens == 5
    assert (finish.usage.prompt_tokens, finish.usage.cached_tokens) == (4, 2)


def test_merging_keeps_logprobs_in_order_and_the_last_finish() -> None:
    from loraplex.platform.engine.wire_mapping import merge_deltas

    merged = merge_deltas(_deltas())
    assert merged.new_logprobs == [d for x in _deltas() for d in x.new_logprobs]
    assert merged.finished and merged.finish_reason == "length"
    assert merge_deltas(_deltas()[:1]) == _deltas()[0]

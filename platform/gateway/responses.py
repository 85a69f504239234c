"""OpenAI responses from the replicas' wire events: the full `chat.completion` /
`text_completion` object, or the SSE stream (the endpoint's opening frames, its deltas and
finish chunks, the usage chunk, `[DONE]`, and an error event if the replica is lost after the
first byte). What each endpoint writes is its own (`endpoints.py`); this drives them. Errors
before the first byte propagate to the app's exception handlers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from loraplex.platform.errors import LoraplexError
from loraplex.platform.gateway import openai_schemas as oa
from loraplex.platform.gateway.completion import Event, Job, Tally, finish_job, merged_events
from loraplex.platform.gateway.service import Gateway
from loraplex.platform.gateway.streaming import DONE, sse, stream_error
from loraplex.platform.wire import DeltaEvent, FinishEvent


async def complete(gw: Gateway, job: Job) -> dict[str, Any]:
    """Run a non-streamed request to the end and build the response object."""
    tally = Tally(len(job.prompt_ids))
    per_choice: dict[int, list[DeltaEvent]] = {i: [] for i in range(job.n)}
    finishes: dict[int, str] = {}
    try:
        async with contextlib.aclosing(merged_events(gw, job)) as events:
            async for index, event in events:
                tally.add(event)
                if isinstance(event, FinishEvent):
                    finishes[index] = event.finish_reason
                else:
                    per_choice[index].append(event)
    except LoraplexError as exc:
        tally.failed = exc.status >= 500
        raise
    finally:
        finish_job(gw, job, tally)
    return job.endpoint.response(job, per_choice, finishes, tally.usage())


async def primed(gw: Gateway, job: Job) -> tuple[Event | None, AsyncGenerator[Event, None]]:
    """Start the request and wait for its first event, so routing errors (503, 4xx)
    are still plain HTTP errors before the stream's first byte."""
    events = merged_events(gw, job)
    try:
        first: Event | None = await anext(events)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await events.aclose()
        raise
    return first, events


async def sse_frames(
    gw: Gateway, job: Job, first: Event | None, rest: AsyncGenerator[Event, None]
) -> AsyncGenerator[bytes, None]:
    """The SSE body: opening frames, deltas, finish chunks, the usage chunk, `[DONE]`."""
    tally = Tally(len(job.prompt_ids))
    writer = job.endpoint.stream_writer(job)

    def frame(index: int, event: DeltaEvent | FinishEvent) -> bytes:
        tally.add(event)
        if isinstance(event, FinishEvent):
            return writer.frame(index, None, event.finish_reason)
        return writer.frame(index, event, None)

    try:
        out = writer.opening() + (frame(*first) if first is not None else b"")
        if first is None:  # the replica ended without an event: a plain stop
            out += writer.frame(0, None, "stop")
        if out:
            yield out
        try:
            async for index, event in rest:
                out = frame(index, event)
                if out:
                    yield out
        except LoraplexError as exc:  # after the first byte an error can only be an event
            tally.failed = True
            yield stream_error(exc)
            return
        if job.include_usage:
            usage = oa.usage_chunk(job.cid, job.created, job.model, job.endpoint.chunk_object,
                                   tally.usage())  # fmt: skip
            yield sse(usage)
        yield DONE
    finally:
        await rest.aclose()
        finish_job(gw, job, tally)

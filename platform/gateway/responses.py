"""OpenAI responses from choice events: the full `chat.completion` / `text_completion`
object, or the SSE stream (role chunks, deltas, finish chunks, the usage chunk, `[DONE]`,
and an error event if the replica is lost after the first byte). Errors before the first byte
propagate to the app's exception handlers.
"""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from loraplex.platform.errors import LoraplexError
from loraplex.platform.gateway import openai_schemas as oa
from loraplex.platform.gateway.completion import Job, Tally, finish_job, merged_events
from loraplex.platform.gateway.outputs import ChoiceEvent
from loraplex.platform.gateway.service import Gateway
from loraplex.platform.gateway.streaming import DONE, sse, stream_error
from loraplex.platform.gateway.tool_outputs import ToolStream, reads_tool_calls, tool_calls_of
from loraplex.platform.tokenizing import display_bytes


def chat_logprobs(event: ChoiceEvent) -> list[dict[str, Any]]:
    """Chat-style logprob entries of one event."""
    return [oa.chat_logprobs_entry(lp.token, lp.logprob, lp.top) for lp in event.logprobs]


def text_logprobs(events: list[ChoiceEvent], offset: int = 0) -> dict[str, Any]:
    """Completions-style logprobs of some events (`text_offset` counted from `offset`)."""
    out: dict[str, Any] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    pos = offset
    chars = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for event in events:
        for lp in event.logprobs:
            out["tokens"].append(lp.token)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append(dict(lp.top))
            out["text_offset"].append(pos)
            # offsets count characters of the text: a token that is part of a character
            # moves the offset only once the character is complete
            pos += len(chars.decode(display_bytes(lp.token)))
    return out


async def complete(gw: Gateway, job: Job) -> dict[str, Any]:
    """Run a non-streamed request to the end and build the response object."""
    tally = Tally(len(job.prompt_ids))
    per_choice: dict[int, list[ChoiceEvent]] = {i: [] for i in range(job.n)}
    try:
        async with contextlib.aclosing(merged_events(gw, job)) as events:
            async for event in events:
                tally.add(event)
                per_choice[event.index].append(event)
    except LoraplexError as exc:
        tally.failed = exc.status >= 500
        raise
    finally:
        finish_job(gw, job, tally)
    choices = []
    for i, got in per_choice.items():
        finish = next((e.finish_reason for e in reversed(got) if e.finish_reason), "stop")
        text = "".join(e.text for e in got)
        if job.kind == "chat":
            lps = (
                [entry for e in got for entry in chat_logprobs(e)]
                if job.top_n is not None
                else None
            )
            choice = {"index": i, "text": text, "logprobs": lps, "finish_reason": finish}
            if job.tools is not None and reads_tool_calls(job.tools) and finish == "stop":
                content, calls = tool_calls_of(job.tools, text)
                if calls:
                    choice.update(text=content, tool_calls=calls, finish_reason="tool_calls")
            choices.append(choice)
        else:
            text_lps = text_logprobs(got) if job.top_n is not None else None
            choices.append(
                {"index": i, "text": text, "logprobs": text_lps, "finish_reason": finish}
            )
    build = oa.chat_completion if job.kind == "chat" else oa.text_completion
    return build(job.cid, job.created, job.model, choices, tally.usage())


async def primed(gw: Gateway, job: Job) -> tuple[ChoiceEvent, AsyncGenerator[ChoiceEvent, None]]:
    """Start the request and wait for its first event, so routing errors (503, 4xx)
    are still plain HTTP errors before the stream's first byte."""
    events = merged_events(gw, job)
    try:
        first = await anext(events)
    except StopAsyncIteration:
        first = ChoiceEvent(0, finish_reason="stop")
    except BaseException:
        await events.aclose()
        raise
    return first, events


async def sse_frames(
    gw: Gateway, job: Job, first: ChoiceEvent, rest: AsyncGenerator[ChoiceEvent, None]
) -> AsyncGenerator[bytes, None]:
    """The SSE body: role chunks, deltas, finish chunks, the usage chunk, `[DONE]`."""
    tally = Tally(len(job.prompt_ids))
    u = job.include_usage
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    offsets = [0] * job.n
    plan = job.tools
    tool_streams = (
        {i: ToolStream(plan) for i in range(job.n)}
        if job.kind == "chat" and plan is not None and reads_tool_calls(plan)
        else {}
    )
    held_lps: dict[int, list[dict[str, Any]]] = {i: [] for i in range(job.n)}

    def chat_frame(index: int, delta: dict[str, Any], **kw: Any) -> bytes:
        return sse(oa.chat_chunk(job.cid, job.created, job.model, index, delta,
                                 with_usage_field=u, **kw))  # fmt: skip

    def tool_frames(event: ChoiceEvent, ts: ToolStream) -> bytes | None:
        """Tool-call deltas; logprobs ride on the choice's last chunk."""
        if job.top_n is not None:
            held_lps[event.index] += chat_logprobs(event)
        out = [chat_frame(event.index, d) for d in ts.deltas(event.text)]
        if event.finish_reason is not None:
            deltas, reason = ts.finish(event.finish_reason)
            out += [chat_frame(event.index, d) for d in deltas]
            lps = held_lps[event.index] if job.top_n is not None else None
            out.append(chat_frame(event.index, {}, logprobs=lps, finish_reason=reason))
        return b"".join(out) or None

    def frame(event: ChoiceEvent) -> bytes | None:
        if not event.text and event.finish_reason is None and not event.logprobs:
            return None
        if event.index in tool_streams:
            return tool_frames(event, tool_streams[event.index])
        if job.kind == "chat":
            delta = {"content": event.text} if event.text or event.finish_reason is None else {}
            lps = chat_logprobs(event) if job.top_n is not None else None
            return sse(
                oa.chat_chunk(
                    job.cid,
                    job.created,
                    job.model,
                    event.index,
                    delta,
                    logprobs=lps,
                    finish_reason=event.finish_reason,
                    with_usage_field=u,
                )
            )
        text_lps = text_logprobs([event], offsets[event.index]) if job.top_n is not None else None
        offsets[event.index] += len(event.text)
        return sse(
            oa.text_chunk(
                job.cid,
                job.created,
                job.model,
                event.index,
                event.text,
                logprobs=text_lps,
                finish_reason=event.finish_reason,
                with_usage_field=u,
            )
        )

    try:
        if job.kind == "chat":
            for i in range(job.n):
                yield sse(
                    oa.chat_chunk(
                        job.cid,
                        job.created,
                        job.model,
                        i,
                        {"role": "assistant", "content": ""},
                        with_usage_field=u,
                    )
                )
        tally.add(first)
        out = frame(first)
        if out:
            yield out
        try:
            async for event in rest:
                tally.add(event)
                out = frame(event)
                if out:
                    yield out
        except LoraplexError as exc:  # after the first byte an error can only be an event
            tally.failed = True
            yield stream_error(exc)
            return
        if u:
            yield sse(oa.usage_chunk(job.cid, job.created, job.model, obj, tally.usage()))
        yield DONE
    finally:
        await rest.aclose()
        finish_job(gw, job, tally)

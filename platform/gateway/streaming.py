"""Server-sent events for OpenAI streams, with a bounded buffer per stream.

A producer task pulls SSE frames from the completion source into a buffer of at most
`max_buffer` frames; the HTTP response drains it (frames that piled up go out as one write). When the client reads too slowly and
the buffer stays full past `stall_timeout_s`, the source is closed (which aborts the
request on its replica) and the client, if it ever catches up, gets an error event.
When the client disconnects, the response task is cancelled and the source is closed at
once, so the replica frees the request's KV blocks and adapter reference. A failure after the
first byte becomes an error event with a message fit for the tenant (`stream_error`); what
happened is logged under the request id.

Aborts sent from `finally` blocks run detached (`spawn`); the gateway waits for them on
shutdown (`drain_background`, from `Gateway.close`) so no replica keeps generating for a
client that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any

from loraplex.platform.errors import GENERIC_MESSAGE, LoraplexError
from loraplex.platform.http_errors import current_request_id, with_request_id
from loraplex.platform.services import request_log

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"

_BACKGROUND: set[asyncio.Task[Any]] = set()


def sse(obj: dict[str, Any]) -> bytes:
    """One `data: {json}` frame."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def sse_error(message: str, type: str = "server_error", code: str | None = None) -> bytes:
    """An error after the stream began: `data: {"error": {...}}` (the SDK raises on it)."""
    return sse({"error": {"message": message, "type": type, "param": None, "code": code}})


def stream_error(exc: BaseException) -> bytes:
    """The error event for a failure after the stream began: a 4xx error's own message; for
    anything else the generic message with the request id, the details logged."""
    request_log.note_stream_error(exc)
    if isinstance(exc, LoraplexError) and exc.status < 500:
        return sse_error(exc.message, type=exc.type, code=exc.code)
    rid = current_request_id()
    if isinstance(exc, LoraplexError):
        log.error("request %s: stream failed: %s %s", rid, exc.code, exc.detail or exc.message)
        return sse_error(with_request_id(exc.message, rid), type=exc.type, code=exc.code)
    log.error("request %s: stream failed", rid, exc_info=exc)
    return sse_error(with_request_id(GENERIC_MESSAGE, rid), code="stream_failed")


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run `coro` detached (kept referenced until done); used for aborts from `finally`."""
    task = asyncio.get_running_loop().create_task(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


async def drain_background(timeout_s: float = 5.0) -> None:
    """Wait (at most `timeout_s`) for detached tasks (aborts) still running: on shutdown,
    before the HTTP client they use is closed."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while _BACKGROUND:
                await asyncio.gather(*list(_BACKGROUND), return_exceptions=True)


_END = object()


class _Stalled(Exception):
    pass


async def bounded_relay(
    source: AsyncGenerator[bytes, None],
    *,
    max_buffer: int = 64,
    stall_timeout_s: float = 30.0,
) -> AsyncIterator[bytes]:
    """Relay `source` through a bounded buffer; see the module docstring for the rules."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    slots = asyncio.Semaphore(max_buffer)
    state: dict[str, Any] = {"error": None, "closed": False}

    async def produce() -> None:
        try:
            async for frame in source:
                try:
                    # Not `wait_for`: on 3.11 it can swallow a cancellation that races with
                    # the acquire completing, and the request would outlive its client.
                    async with asyncio.timeout(stall_timeout_s):
                        await slots.acquire()
                except TimeoutError:
                    raise _Stalled() from None
                if state["closed"]:
                    break
                queue.put_nowait(frame)
        except _Stalled as exc:
            state["error"] = exc
        except Exception as exc:  # the source failed after the first byte
            state["error"] = exc
        finally:
            await source.aclose()
            queue.put_nowait(_END)

    task = asyncio.get_running_loop().create_task(produce())
    finished = False
    try:
        ended = False
        while not ended:
            batch = [await queue.get()]
            while not queue.empty() and batch[-1] is not _END:
                batch.append(queue.get_nowait())  # frames that piled up: one write
            if batch[-1] is _END:
                batch.pop()
                ended = True
            for _ in batch:
                slots.release()
            if batch:
                yield b"".join(batch)
        error = state["error"]
        if isinstance(error, _Stalled):
            yield sse_error(
                f"The stream was aborted: the client read nothing for {stall_timeout_s:g}s.",
                type="timeout",
                code="stream_stalled",
            )
        elif error is not None:
            yield stream_error(error)
        finished = True
    finally:
        state["closed"] = True  # the producer stops at its next frame even if not cancelled
        if not finished and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)

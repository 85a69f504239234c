"""Server-sent events for OpenAI streams, with a bounded buffer per stream.

A producer task pulls SSE frames from the completion source into a buffer of at most
`max_buffer` frames; the HTTP response drains it. When the client reads too slowly and
the buffer stays full past `stall_timeout_s`, the source is closed (which aborts the
request on its replica) and the client, if it ever catches up, gets an error event.
When the client disconnects, the response task is cancelled and the source is closed at
once, so the replica frees the request's KV blocks and adapter reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any

DONE = b"data: [DONE]\n\n"

_BACKGROUND: set[asyncio.Task[Any]] = set()


def sse(obj: dict[str, Any]) -> bytes:
    """One `data: {json}` frame."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def sse_error(message: str, type: str = "server_error", code: str | None = None) -> bytes:
    """An error after the stream began: `data: {"error": {...}}` (the SDK raises on it)."""
    return sse({"error": {"message": message, "type": type, "param": None, "code": code}})


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run `coro` detached (kept referenced until done); used for aborts from `finally`."""
    task = asyncio.get_running_loop().create_task(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


async def drain_background() -> None:
    """Wait for detached tasks (aborts) still running; for shutdown and tests."""
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
        while True:
            item = await queue.get()
            if item is _END:
                break
            slots.release()
            yield item
        error = state["error"]
        if isinstance(error, _Stalled):
            yield sse_error(
                f"The stream was aborted: the client read nothing for {stall_timeout_s:g}s.",
                type="timeout",
                code="stream_stalled",
            )
        elif error is not None:
            yield sse_error(f"The stream failed: {error}", code="stream_failed")
        finished = True
    finally:
        state["closed"] = True  # the producer stops at its next frame even if not cancelled
        if not finished and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)

"""Records every tenant request under `/v1/` that ends with status >= 400, or whose 200 stream
carries an error event, in the request log (`services/request_log.py`), outside the routes:
the status, request id and error code come from the answer itself, the detail the tenant was
not shown from the error handler (or the gateway, for a stream), and where the request went
from the `Route` the gateway fills while it serves it."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

import anyio
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.platform.errors import GENERIC_MESSAGE
from loraplex.platform.http_errors import ERROR_DETAIL_KEY, REQUEST_ID_HEADER
from loraplex.platform.services.api_keys import hash_key
from loraplex.platform.services.request_log import (
    Entry,
    RequestLogWriter,
    Route,
    close_route,
    open_route,
)
from loraplex.platform.settings import Settings

PREFIX = "/v1/"
GATHER_S = 0.5  # the first entry's flush waits this long, so a burst is written at once
_BODY_PEEK = 16_384  # an error body is small; more than this is not parsed
_TOKEN_CAP = 512
# An SSE error event starts a frame so: JSON in a data line escapes the quotes of any text the
# model wrote, so generated text cannot look like one.
_SSE_ERROR = b'data: {"error":'


def request_log_writer(
    settings: Settings, sessions: sessionmaker[Session] | None
) -> RequestLogWriter | None:
    """The app's request-log writer (None without a database)."""
    if sessions is None:
        return None
    return RequestLogWriter(sessions, timedelta(days=settings.request_log_retention_days))


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and 0 < len(token) <= _TOKEN_CAP:
                return hash_key(token)
    return None


def _error_of(body: bytes) -> tuple[str | None, str | None]:
    try:
        error = json.loads(body).get("error") or {}
        return error.get("code"), error.get("message")
    except (ValueError, AttributeError, RecursionError):
        return None, None


def _event_of(chunk: bytes) -> bytes:
    """The JSON of the first SSE error event in `chunk` (frames are sent whole)."""
    start = chunk.index(_SSE_ERROR) + len(b"data: ")
    end = chunk.find(b"\n", start)
    return chunk[start : end if end >= 0 else len(chunk)][:_BODY_PEEK]


class RequestLogMiddleware:
    """Pure ASGI (streams pass through untouched); writes happen after the answer is sent, in
    a worker thread, one flush at a time per process: the first entry starts a flush
    `GATHER_S` later, so the entries of a burst share one transaction (a flood of refusals
    would otherwise cost a database write each on the API's shared threads). What is queued
    at shutdown is written before the app reports it has stopped."""

    def __init__(self, app: ASGIApp, writer: RequestLogWriter | None) -> None:
        self.app = app
        self.writer = writer
        self._flush_task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.writer is not None and scope["type"] == "lifespan":
            await self.app(scope, receive, self._flushing_at_shutdown(send))
            return
        if self.writer is None or scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        began = time.monotonic()
        seen: dict = {"status": 0, "rid": "", "body": b"", "sse": False, "event": b""}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", []):
                    if name == REQUEST_ID_HEADER.encode():
                        seen["rid"] = value.decode("latin-1")
                    elif name == b"content-type":
                        seen["sse"] = value.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if seen["status"] >= 400 and len(seen["body"]) < _BODY_PEEK:
                    seen["body"] += chunk[:_BODY_PEEK]
                elif seen["sse"] and not seen["event"] and _SSE_ERROR in chunk:
                    seen["event"] = _event_of(chunk)
            await send(message)

        route, token = open_route()
        crashed: BaseException | None = None
        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # the outermost handler answers 500; it is logged here
            crashed = exc
            raise
        finally:
            close_route(token)
            status = 500 if crashed is not None and seen["status"] < 400 else seen["status"]
            if status >= 400 or seen["event"]:
                self._add(scope, status, seen, began, crashed, route)
                self._schedule_flush()

    def _add(
        self,
        scope: Scope,
        status: int,
        seen: dict,
        began: float,
        crashed: BaseException | None,
        route: Route,
    ) -> None:
        assert self.writer is not None
        in_stream = status < 400
        code, message = _error_of(seen["event"] if in_stream else seen["body"])
        detail = route.stream_detail if in_stream else scope.get(ERROR_DETAIL_KEY)
        if crashed is not None:
            code, message = code or "internal_error", message or GENERIC_MESSAGE
            detail = detail or f"{type(crashed).__name__}: {crashed}"
        self.writer.add(
            Entry(
                request_id=seen["rid"] or scope.get("loraplex.request_id") or "",
                created_at=datetime.now(UTC),
                method=scope.get("method", ""),
                path=scope["path"],
                status=status,
                latency_ms=int((time.monotonic() - began) * 1000),
                code=code if isinstance(code, str) else None,
                message=message if isinstance(message, str) else None,
                detail=detail if isinstance(detail, str) else None,
                key_hash=_bearer(scope),
                route=route,
                in_stream=in_stream,
            )
        )

    def _schedule_flush(self) -> None:
        """Start a flush `GATHER_S` from now, unless one is started or running already (that
        one loops until the queue is empty)."""
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.get_running_loop().create_task(self._flush(GATHER_S))

    async def _flush(self, after_s: float) -> None:
        """Wait `after_s` (entries gather), then write what is queued, in a worker thread."""
        assert self.writer is not None
        await asyncio.sleep(after_s)
        while self.writer.pending():
            await anyio.to_thread.run_sync(self.writer.flush)

    def _flushing_at_shutdown(self, send: Send) -> Send:
        """The lifespan's `send`, writing what is queued before shutdown is reported done."""

        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                task = self._flush_task
                if task is not None and not task.done():
                    task.cancel()  # a write under way finishes first (threads are not cut)
                    await asyncio.gather(task, return_exceptions=True)
                assert self.writer is not None
                await anyio.to_thread.run_sync(self.writer.flush)
            await send(message)

        return wrapped

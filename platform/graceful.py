"""Graceful shutdown for the platform's HTTP servers (the API/gateway and engine replicas).

On SIGTERM (or a first Ctrl-C) a server stops taking new requests and finishes the ones it
has: uvicorn stops listening and closes idle connections; `DrainGuard` answers any request
that still arrives on an open connection with 503 + Retry-After; running requests (the
gateway's streams, a replica's generations) go on for up to `drain_timeout_s`; then the app's
lifespan shuts down and the process exits 0. (Plain `uvicorn.run` re-raises the signal after
its shutdown, so a drained server would exit -15 and look killed to its supervisor.)
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from loraplex.platform.transport_cycles import free_closed_transports

DRAIN_RETRY_AFTER_S = 2
_draining = threading.Event()


def draining() -> bool:
    """True once this process was told to shut down."""
    return _draining.is_set()


def start_draining() -> None:
    """Refuse new requests from now on (what SIGTERM does; tests call it directly)."""
    _draining.set()


class DrainGuard:
    """ASGI middleware: once draining, a new HTTP request gets 503 (`shutting_down`) with
    Retry-After and `connection: close`; requests already running are not touched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _draining.is_set():
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {
            "message": "The server is shutting down; retry on another instance.",
            "type": "service_unavailable", "param": None, "code": "shutting_down",
        }}).encode()  # fmt: skip
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(DRAIN_RETRY_AFTER_S).encode()), (b"connection", b"close"),
        ]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})


class GracefulServer(uvicorn.Server):
    """A uvicorn server whose SIGTERM/SIGINT drain it and let the process exit 0 (a second
    Ctrl-C still forces it)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        start_draining()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(app: Any, *, drain_timeout_s: float, **config: Any) -> int:
    """Run `app` (an ASGI app or an import string; `config` is uvicorn's: fd or host/port,
    log_level, factory) until SIGTERM/SIGINT, drain for up to `drain_timeout_s`; returns 0."""
    free_closed_transports()  # full collections on the loop: see transport_cycles.py
    server = GracefulServer(
        uvicorn.Config(app, timeout_graceful_shutdown=drain_timeout_s, **config)  # type: ignore[arg-type]  # hinted int; asyncio waits a float
    )
    server.run()
    return 0

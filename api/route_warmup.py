"""Builds the router's per-route matching state before the app serves: FastAPI builds it
lazily, on the first request that walks past each route (~90 ms of CPU for our table, on the
event loop, in front of the first tenant's request). One unmatched request, run through the
bare router, walks every route once."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.types import Message

_PATH = "/.loraplex-route-warmup"  # matches no route, so the router walks them all


def warm_routes(app: FastAPI) -> None:
    """Walk `app`'s whole route table once, off any running loop (create_app may be called
    from inside one, as uvicorn's factory mode does)."""

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        return None

    async def walk() -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": _PATH,
            "raw_path": _PATH.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [],
            "server": ("warmup", 0),
        }
        with contextlib.suppress(HTTPException):  # the router's "not found", as expected
            await app.router(scope, receive, send)

    # The walk awaits nothing that is not ready, so it completes on its first step without an
    # event loop (none of a server's loops sees it); should it ever wait, it runs on a private
    # loop in a short-lived thread instead.
    step = walk()
    try:
        step.send(None)
    except StopIteration:
        return
    step.close()
    thread = threading.Thread(target=lambda: asyncio.run(walk()), name="route-warmup")
    thread.start()
    thread.join()

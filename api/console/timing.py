"""`Server-Timing: app;dur=<ms>` on every console response: the server time of a page, which
`loraplex bench console` reads (pure ASGI, so streamed API responses are left alone)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ServerTiming:
    """Adds the time from request to response start for paths under `prefix`."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - began) * 1000
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", f"app;dur={ms:.2f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)

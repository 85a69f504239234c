"""The API's request-body limit. Errors become OpenAI-shaped responses through the
platform's one mapping (`loraplex.platform.http_errors.install_error_handlers`)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.platform.http_errors import error_response


class BodyTooLarge(StarletteHTTPException):
    """The request body went over its limit while being read (FastAPI lets HTTPException pass)."""

    def __init__(self, limit: int):
        super().__init__(413, f"The request body is larger than {limit} bytes.")
        self.limit = limit


class BodyLimitMiddleware:
    """Refuse bodies over a per-route limit with 413: by Content-Length up front, and by
    counting bytes as they arrive (chunked uploads)."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str, str], int | None]):
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["method"], scope["path"])
        if limit is None:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > limit:
                    response = error_response(
                        413 if declared > limit else 400,
                        f"The request body is larger than {limit} bytes."
                        if declared > limit
                        else "Invalid Content-Length header.",
                        code="request_too_large" if declared > limit else "invalid_request",
                    )
                    await response(scope, receive, send)
                    return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)

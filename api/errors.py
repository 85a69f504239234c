"""The API's request-body limit, and its 503 while the database or Redis is down. Errors become
OpenAI-shaped responses through the platform's one mapping (`platform/http_errors.py`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.platform.http_errors import REQUEST_ID_HEADER, current_request_id, error_response
from loraplex.platform.services.names import has_control_characters

log = logging.getLogger(__name__)


class BodyTooLarge(StarletteHTTPException):
    """The request body went over its limit while being read (FastAPI lets HTTPException pass)."""

    def __init__(self, limit: int):
        super().__init__(413, f"The request body is larger than {limit} bytes.")
        self.limit = limit


async def _backend_down(request: Request, exc: Exception) -> JSONResponse:
    """The database (or Redis) is unreachable, e.g. restarting under `loraplex up`: a 503 the
    client can retry, not a 500."""
    what = "database" if isinstance(exc, DBAPIError) else "Redis"
    log.warning("request %s: %s unavailable: %s", current_request_id(), what, type(exc).__name__)
    headers = {"retry-after": "5"}
    rid = current_request_id()
    if rid:
        headers[REQUEST_ID_HEADER] = rid
    return error_response(
        503,
        f"The platform's {what} is unavailable right now; retry shortly.",
        code=f"{what.lower()}_unavailable",
        type="service_unavailable",
        headers=headers,
    )


async def _bad_value(request: Request, exc: Exception) -> JSONResponse:
    """A value the database cannot hold (a NUL character in text, a number out of range) that
    got past the edge's checks: the client's input, so a 400, never a 500."""
    rid = current_request_id()
    log.warning("request %s: value refused by the database: %s", rid, type(exc).__name__)
    return error_response(
        400,
        "A value in the request cannot be stored (a NUL or control character, or out of range).",
        code="invalid_value",
        headers={REQUEST_ID_HEADER: rid} if rid else None,
    )


def install_backend_down_handlers(app: FastAPI) -> None:
    """Answer 503 + Retry-After while the database or Redis is down (the API's own backends;
    the replica has none), on top of the platform's one mapping; a value the database
    refuses is a 400."""
    for exc in (OperationalError, InterfaceError, RedisConnectionError):
        app.add_exception_handler(exc, _backend_down)
    app.add_exception_handler(DataError, _bad_value)


class ControlCharacterGuard:
    """Refuse a request whose path names something with a control character (NUL among
    them) with 400 `invalid_name`, at the edge, before any route or query sees it. The
    console answers such paths in its own shape (`api/console`)."""

    def __init__(self, app: ASGIApp, skip_prefixes: tuple[str, ...] = ("/console",)) -> None:
        self.app = app
        self.skip_prefixes = skip_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and not scope["path"].startswith(self.skip_prefixes)
            and has_control_characters(scope["path"])
        ):
            response = error_response(
                400,
                "The path contains a control character (NUL or another); names and ids never do.",
                code="invalid_name",
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


UNREAD_BODY_CLOSE_BYTES = 64 * 1024


def _declared_large(scope: Scope) -> bool:
    """Whether the request declares a body past `UNREAD_BODY_CLOSE_BYTES` (or a chunked one)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return value.isdigit() and int(value) > UNREAD_BODY_CLOSE_BYTES
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return True
    return False


class BodyLimitMiddleware:
    """Refuse bodies over a per-route limit with 413: by Content-Length up front, and by
    counting bytes as they arrive (chunked uploads). An answer that goes out before a large
    body was read closes the connection."""

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
                        # the body is never read: close rather than go on receiving it
                        headers={"connection": "close"},
                    )
                    await response(scope, receive, send)
                    return
        seen = 0
        received_all = False

        async def limited_receive() -> Message:
            nonlocal seen, received_all
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                received_all = not message.get("more_body", False)
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        big = _declared_large(scope)

        async def closing_send(message: Message) -> None:
            # An answer sent before a large body was read (a 429, a 401): close the connection
            # rather than go on receiving bytes nobody will read.
            if message["type"] == "http.response.start" and big and not received_all:
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        await self.app(scope, limited_receive, closing_send)

"""OpenAI-shaped errors everywhere: `{"error": {"message", "type", "param", "code"}}`.

Service errors, HTTP errors, request validation errors, bodies over the size limit and
unhandled exceptions all answer in this shape with the right status.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.platform.services.errors import ServiceError

log = logging.getLogger(__name__)

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(Exception):
    """An error the API answers directly with a status and an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or error_type(status)
        self.headers = headers or {}


class BodyTooLarge(StarletteHTTPException):
    """The request body went over its limit while being read (FastAPI lets HTTPException pass)."""

    def __init__(self, limit: int):
        super().__init__(413, f"The request body is larger than {limit} bytes.")
        self.limit = limit


def error_type(status: int) -> str:
    """The OpenAI error type for an HTTP status."""
    return TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    type: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A JSONResponse carrying an OpenAI-shaped error."""
    body = error_body(message, type=type or error_type(status), code=code, param=param)
    return JSONResponse(body, status_code=status, headers=headers)


def _loc_param(loc: tuple | list) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return error_response(
        exc.status, exc.message, code=exc.code, param=exc.param, type=exc.type, headers=exc.headers
    )


async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
    return error_response(exc.status, exc.message, code=exc.code, param=exc.param)


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
        exc.status_code
    )
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = "No such route or resource."
    return error_response(
        exc.status_code, message, code=code, headers=getattr(exc, "headers", None)
    )


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = _loc_param(first.get("loc", ()))
    msg = first.get("msg", "invalid request")
    message = f"{param}: {msg}" if param else str(msg)
    return error_response(422, message, code="invalid_request", param=param)


async def _backend_down(_: Request, exc: Exception) -> JSONResponse:
    """The database (or Redis) is unreachable, e.g. restarting under `loraplex up`: a 503 the
    client can retry, not a 500."""
    what = "database" if isinstance(exc, DBAPIError) else "Redis"
    log.warning("%s unavailable: %s", what, type(exc).__name__)
    return error_response(
        503,
        f"The platform's {what} is unavailable right now; retry shortly.",
        code=f"{what.lower()}_unavailable",
        type="service_unavailable",
        headers={"retry-after": "5"},
    )


async def _unhandled(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(
        500, "The server had an error while processing your request.", code="internal_error"
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every error into the OpenAI shape."""
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(ServiceError, _service_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(OperationalError, _backend_down)
    app.add_exception_handler(InterfaceError, _backend_down)
    app.add_exception_handler(RedisConnectionError, _backend_down)
    app.add_exception_handler(Exception, _unhandled)


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

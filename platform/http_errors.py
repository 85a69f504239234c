"""Errors to HTTP responses, once, for every FastAPI app of the platform (the API and the
engine replica): `install_error_handlers(app)`.

Each request gets an id (`x-request-id` on every response, errors and streams included; a
replica keeps the id its gateway sent). A `LoraplexError` answers with its status and body;
one with a `detail`, or a status >= 500, is logged with that id; 5xx messages name the id.
Anything else is a generic 500 with the id, and its traceback goes to the log.
"""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.platform.errors import (
    GENERIC_MESSAGE,
    LoraplexError,
    client_closed,
    error_body,
    error_type,
)

log = logging.getLogger("loraplex.errors")

REQUEST_ID_HEADER = "x-request-id"
_SCOPE_KEY = "loraplex.request_id"
# The detail of an error answer that the client was not shown (the request log keeps it).
ERROR_DETAIL_KEY = "loraplex.error_detail"
_INCOMING = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request being served (None outside one)."""
    return _current.get()


def with_request_id(message: str, request_id: str | None = None) -> str:
    """`message` naming the request id, for answers a tenant may need to report."""
    rid = request_id or current_request_id()
    return f"{message} (request id {rid})" if rid else message


class RequestIdMiddleware:
    """Give each request an id (or keep a well-formed incoming one when `trust_incoming`),
    make it current, and stamp it on the response."""

    def __init__(self, app: ASGIApp, trust_incoming: bool = False) -> None:
        self.app = app
        self.trust_incoming = trust_incoming

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        if self.trust_incoming:
            sent = dict(scope.get("headers", [])).get(REQUEST_ID_HEADER.encode(), b"").decode()
            rid = sent if _INCOMING.match(sent) else None
        rid = rid or f"req_{uuid.uuid4().hex}"
        scope[_SCOPE_KEY] = rid
        _current.set(rid)  # the request runs in its own task: no reset needed
        header = (REQUEST_ID_HEADER.encode(), rid.encode())

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != header[0]]
                message["headers"] = [*headers, header]
            await send(message)

        await self.app(scope, receive, stamped)


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


def _request_id(request: Request) -> str | None:
    return request.scope.get(_SCOPE_KEY) or current_request_id()


def _headers(request: Request, own: dict[str, str] | None = None) -> dict[str, str]:
    """Headers of an error answer: the error's own, the ones the route set on
    `request.state.response_headers` (rate limits), and the request id."""
    extra = getattr(request.state, "response_headers", None) or {}
    out = {**extra, **(own or {})}
    rid = _request_id(request)
    if rid:
        out[REQUEST_ID_HEADER] = rid
    return out


async def _loraplex_error(request: Request, exc: LoraplexError) -> JSONResponse:
    rid = _request_id(request)
    message = exc.message
    if exc.detail:
        request.scope[ERROR_DETAIL_KEY] = str(exc.detail)
    if exc.status >= 500:
        message = with_request_id(message, rid)
        log.error("request %s: %s %s: %s", rid, exc.status, exc.code, exc.detail or exc.message)
    elif exc.detail:
        log.warning("request %s: %s %s: %s", rid, exc.status, exc.code, exc.detail)
    return error_response(
        exc.status,
        message,
        code=exc.code,
        param=exc.param,
        type=exc.type,
        headers=_headers(request, exc.headers),
    )


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
        exc.status_code
    )
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = "No such route or resource."
    headers = _headers(request, getattr(exc, "headers", None))
    return error_response(exc.status_code, message, code=code, headers=headers)


def _loc_param(loc: tuple | list) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = _loc_param(first.get("loc", ()))
    msg = first.get("msg", "invalid request")
    message = f"{param}: {msg}" if param else str(msg)
    return error_response(
        422, message, code="invalid_request", param=param, headers=_headers(request)
    )


async def _client_gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
    """The client left before its body arrived: it closed its request (the 499 a client
    leaving during the work gets), no server error to report. Nobody reads the answer; the
    request log keeps it."""
    return await _loraplex_error(request, client_closed())


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    rid = _request_id(request)
    log.error("request %s: unhandled %s", rid, type(exc).__name__, exc_info=exc)
    return error_response(
        500,
        with_request_id(GENERIC_MESSAGE, rid),
        code="internal_error",
        headers=_headers(request),
    )


def install_error_handlers(app: FastAPI, *, trust_incoming_request_id: bool = False) -> None:
    """Register the handlers that turn every error into the OpenAI shape, and request ids."""
    app.add_exception_handler(LoraplexError, _loraplex_error)  # type: ignore[arg-type]  # hinted over Exception; called for its class
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]  # hinted over Exception; called for its class
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]  # hinted over Exception; called for its class
    app.add_exception_handler(ClientDisconnect, _client_gone)  # type: ignore[arg-type]  # hinted over Exception; called for its class
    app.add_exception_handler(Exception, _unhandled)
    app.add_middleware(RequestIdMiddleware, trust_incoming=trust_incoming_request_id)

"""One error hierarchy for the whole platform: every error a caller can see carries an HTTP
status and the OpenAI error object (`message`, `type`, `param`, `code`).

`LoraplexError` is the base; `HttpError` takes its status from the raiser; the services'
`ServiceError` family (`services/errors.py`) sets it per class; `InternalError` is a failure
that is ours, not the caller's. FastAPI exception handlers (`platform/http_errors.py`) turn
them into responses, the same way for the API and for engine replicas.

What a caller sees is `message`, written for them; internals (exception text, replica URLs,
storage errors) go in `detail`, which is only logged, under the request's id. Answers with a
status >= 500 name that id so a tenant can report it.
"""

from __future__ import annotations

from typing import Any

GENERIC_MESSAGE = "The server had an error while processing your request."

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


def error_type(status: int) -> str:
    """The OpenAI error type for an HTTP status."""
    return TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class LoraplexError(Exception):
    """Base: a status, a message fit to show the caller, and log-only `detail`."""

    status: int = 500
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param
        self.type = type or error_type(self.status)
        self.headers = dict(headers or {})
        self.detail = detail

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients expect."""
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


class HttpError(LoraplexError):
    """An error whose status the raiser chooses: `HttpError(404, "...", code=...)`."""

    def __init__(self, status: int, message: str, **kw: Any) -> None:
        super().__init__(message, status=status, **kw)


def client_closed() -> HttpError:
    """The client left before its answer (499): during the work, or before its body arrived."""
    return HttpError(499, "The client closed the request.", code="client_closed")


class InternalError(LoraplexError):
    """Our failure, not the caller's: the caller gets the generic message (and the request
    id); `detail` says what happened, in the log."""

    default_code = "internal_error"

    def __init__(self, detail: str, *, status: int = 500, code: str | None = None) -> None:
        super().__init__(GENERIC_MESSAGE, status=status, code=code, detail=detail)

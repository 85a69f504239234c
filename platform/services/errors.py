"""Errors a service raises for bad input or state: the `LoraplexError` family
(`platform/errors.py`), one status per class."""

from __future__ import annotations

from loraplex.platform.errors import LoraplexError


class ServiceError(LoraplexError):
    """Base: a message fit to show the caller, a machine-readable code and the offending
    param; `detail` (internals, e.g. a storage exception) only reaches the log."""

    status = 400

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, code=code, param=param, detail=detail)


class InvalidInput(ServiceError):
    """The request's content is wrong (400)."""

    status = 400


class NotFound(ServiceError):
    """No such resource for this caller (404); also used for other tenants' resources."""

    status = 404


class TenantSuspended(ServiceError):
    """The caller's tenant is suspended: every one of its keys is refused (403)."""

    status = 403
    default_code = "tenant_suspended"


class Conflict(ServiceError):
    """The resource exists already or is in the wrong state (409)."""

    status = 409


class TooLarge(ServiceError):
    """The request or one of its files is over a size limit (413)."""

    status = 413


class Unprocessable(ServiceError):
    """Well-formed but not acceptable, e.g. an idempotency key reused with another body (422)."""

    status = 422


class Unavailable(ServiceError):
    """A backing service (object storage, broker) failed; retry later (503)."""

    status = 503


class LimitExceeded(ServiceError):
    """A per-tenant limit (concurrent uploads, stored bytes) refuses the request (429)."""

    status = 429

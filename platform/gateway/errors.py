"""The gateway's common client-facing errors (all `HttpError`s of `platform/errors.py`)."""

from __future__ import annotations

from loraplex.platform.errors import HttpError


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> HttpError:
    """A 400 for input the client must fix."""
    return HttpError(400, message, param=param, code=code)


def model_not_found(model: str) -> HttpError:
    """A 404 for a model (adapter or base) the caller may not see or that does not exist."""
    return HttpError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


NO_REPLICA_RETRY_AFTER_S = 5


def no_replica(detail: str | None = None) -> HttpError:
    """A 503 when the deployment has no live replica that can take the request (`detail`,
    which may name replicas, is only logged); `Retry-After` tells clients when to try again
    (a crashed replica is restarted by its supervisor)."""
    return HttpError(
        503,
        "No replica is available to serve this model right now.",
        type="service_unavailable",
        code="no_replica_available",
        detail=detail,
        headers={"retry-after": str(NO_REPLICA_RETRY_AFTER_S)},
    )


def still_starting(waited_s: float, retry_after_s: int = NO_REPLICA_RETRY_AFTER_S) -> HttpError:
    """A 503 after a request waited its deployment's whole cold-start bound for a replica."""
    return HttpError(
        503,
        f"The model's replicas are still starting (waited {waited_s:.0f}s); try again shortly.",
        type="service_unavailable",
        code="replicas_starting",
        headers={"retry-after": str(retry_after_s)},
    )

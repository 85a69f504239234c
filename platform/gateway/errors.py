"""One exception for every client-facing gateway failure, carrying the OpenAI error shape.

The web layer turns it into `{"error": {"message", "type", "param", "code"}}` with `status`.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """A failure the client should see as an OpenAI-shaped error with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients expect."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(
    message: str, param: str | None = None, code: str = "invalid_value"
) -> GatewayError:
    """A 400 for input the client must fix."""
    return GatewayError(400, message, param=param, code=code)


def model_not_found(model: str) -> GatewayError:
    """A 404 for a model (adapter or base) the caller may not see or that does not exist."""
    return GatewayError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def no_replica(
    message: str = "No replica is available to serve this model right now.",
) -> GatewayError:
    """A 503 when the deployment has no live replica that can take the request; `Retry-After`
    tells clients when to try again (a crashed replica is restarted by its supervisor)."""
    return GatewayError(
        503,
        message,
        type="service_unavailable",
        code="no_replica_available",
        headers={"retry-after": str(NO_REPLICA_RETRY_AFTER_S)},
    )


NO_REPLICA_RETRY_AFTER_S = 5

"""HTTP client for one engine replica's internal endpoint, in the wire format of
`loraplex.platform.wire`: `POST /generate` (a stream of `DeltaEvent`s ending in a
`FinishEvent`), `POST /abort/{request_id}`, `GET /state`.

Every answer is validated against the wire models; anything else (another wire version, an
unknown field, a stream that ends without its finish event) is a protocol error, logged and
treated as a failed replica. Failures are sorted for the router: `ReplicaUnavailable` (could
not connect, 5xx, broken stream or protocol) may be retried on another replica if no token
was sent yet; `ReplicaRejected` (a 4xx) is not retried.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping

import httpx
from pydantic import ValidationError

from loraplex.platform.errors import GENERIC_MESSAGE, LoraplexError
from loraplex.platform.gateway.replica_stream import StreamBroken, post_stream
from loraplex.platform.http_errors import REQUEST_ID_HEADER, current_request_id
from loraplex.platform.wire import (
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    AbortResult,
    AdapterRef,
    DeltaEvent,
    ErrorBody,
    ErrorEvent,
    FinishEvent,
    GenerateRequest,
    ReplicaState,
    WarmRequest,
    WarmResult,
    decode_event,
)
from loraplex.platform.wire.auth import bearer

log = logging.getLogger(__name__)
_VERSION = str(WIRE_VERSION)


class ReplicaUnavailable(Exception):
    """The replica could not take or finish the request (dead, overloaded, broken stream)."""


class ReplicaSlow(ReplicaUnavailable):
    """The replica accepted the connection but did not answer in time: busy, not dead (a
    dead process refuses the connection at once)."""


class ReplicaRejected(LoraplexError):
    """The replica refused the request (a 4xx). The gateway validates everything a tenant
    controls first, so this is the platform's fault: the tenant gets the generic message (a
    501 when the replica cannot serve the feature asked for), the replica's words are logged."""

    def __init__(self, status: int, detail: str) -> None:
        if status == 501:
            super().__init__(
                "This model's deployment cannot serve this request.",
                status=501,
                type="invalid_request_error",
                code="not_implemented",
                detail=detail,
            )
        else:
            super().__init__(GENERIC_MESSAGE, status=500, code="internal_error", detail=detail)
        self.replica_status = status


def _protocol_error(url: str, what: str) -> ReplicaUnavailable:
    log.error("replica %s broke the wire protocol (v%s): %s", url, _VERSION, what)
    return ReplicaUnavailable(f"replica {url}: protocol error: {what}")


def _check_version(url: str, headers: Mapping[str, str]) -> None:
    got = headers.get(WIRE_VERSION_HEADER)  # a lower-case name: httpx's headers and ours agree
    if got != _VERSION:
        raise _protocol_error(url, f"it speaks wire version {got or 'none'}, not {_VERSION}")


def _rejection(url: str, status: int, raw: bytes) -> ReplicaRejected:
    try:
        body = ErrorBody.model_validate_json(raw)
    except ValidationError as exc:
        raise _protocol_error(url, f"error body of a {status}: {exc}") from None
    return ReplicaRejected(status, f"replica {url} refused it ({status} {body.error.code}): "
                                   f"{body.error.message}")  # fmt: skip


def _event(url: str, frame: bytes) -> DeltaEvent | FinishEvent:
    """One `data: {json}` frame of a `/generate` stream; an error event raises."""
    if not frame.startswith(b"data: "):
        raise _protocol_error(url, f"stream frame {frame[:200]!r}")
    try:
        event = decode_event(frame[6:])
    except ValidationError as exc:
        raise _protocol_error(url, f"stream event: {exc}") from None
    if isinstance(event, ErrorEvent):
        raise ReplicaUnavailable(f"replica {url} failed: {event.error.code}: {event.error.message}")
    return event


def _coalesced(events: list[DeltaEvent | FinishEvent]) -> list[DeltaEvent | FinishEvent]:
    """Consecutive delta events of one read as one (tokens, text and logprobs in order): a
    backlog is relayed as one chunk, not one per engine step."""
    out: list[DeltaEvent | FinishEvent] = []
    for event in events:
        prev = out[-1] if out else None
        if (
            isinstance(event, DeltaEvent)
            and isinstance(prev, DeltaEvent)
            and event.prompt_logprobs is None
            and (prev.logprobs is None) == (event.logprobs is None)
        ):
            out[-1] = DeltaEvent.model_construct(
                token_ids=prev.token_ids + event.token_ids,
                text=prev.text + event.text,
                logprobs=None if prev.logprobs is None else prev.logprobs + (event.logprobs or []),
                prompt_logprobs=prev.prompt_logprobs,
            )
        else:
            out.append(event)
    return out


CONNECT_TIMEOUT_S = 2.0


class ReplicaClient:
    """Talks to replicas: `/generate` streams over connections of their own
    (`replica_stream.py`), the short calls over one shared `httpx.AsyncClient`."""

    def __init__(self, http: httpx.AsyncClient, secret: str, read_timeout_s: float = 120.0) -> None:
        self._http = http
        self._read_timeout_s = read_timeout_s
        self._base_headers = {WIRE_VERSION_HEADER: _VERSION, "authorization": bearer(secret)}

    def _headers(self, **extra: str) -> dict[str, str]:
        """The replica secret, the wire version, and this request's id (for joint logs)."""
        rid = current_request_id()
        ids = {REQUEST_ID_HEADER: rid} if rid else {}
        return {**self._base_headers, **ids, **extra}

    async def generate(
        self, url: str, req: GenerateRequest
    ) -> AsyncGenerator[DeltaEvent | FinishEvent, None]:
        """Stream `req` from the replica at `url`: delta events, then its finish event."""
        headers = self._headers(**{"content-type": "application/json"})
        try:
            async with post_stream(
                url,
                "/generate",
                req.model_dump_json().encode(),
                headers,
                connect_timeout_s=CONNECT_TIMEOUT_S,
                read_timeout_s=self._read_timeout_s,
            ) as resp:
                if resp.status >= 500 or resp.status == 429:
                    body = await resp.read_all()
                    raise ReplicaUnavailable(
                        f"replica {url} answered {resp.status}: {body[:500]!r}"
                    )
                _check_version(url, resp.headers)
                if resp.status >= 400:
                    raise _rejection(url, resp.status, await resp.read_all())
                buffer = b""
                async for chunk in resp.body():
                    frames = (buffer + chunk).split(b"\n\n")
                    buffer = frames.pop()  # an incomplete frame waits for the next read
                    events = [_event(url, frame) for frame in frames if frame.strip()]
                    for event in _coalesced(events):
                        yield event
                        if isinstance(event, FinishEvent):
                            return
                raise ReplicaUnavailable(f"replica {url}: the stream ended before its finish")
        except StreamBroken as exc:
            raise ReplicaUnavailable(f"replica {url}: {exc}") from exc

    async def abort(self, url: str, request_id: str) -> int:
        """Ask the replica to drop `request_id` now (frees its KV blocks and adapter ref);
        returns the prompt tokens it had computed for it (0 when it cannot say)."""
        # A dead replica has nothing left to free; an unknown id has already finished.
        try:
            resp = await self._http.post(
                f"{url}/abort/{request_id}", headers=self._headers(), timeout=2.0
            )
        except httpx.HTTPError:
            return 0
        if resp.status_code != 200:
            return 0
        try:
            return AbortResult.model_validate_json(resp.content).computed_prompt_tokens
        except ValidationError:
            return 0

    async def warm(self, url: str, adapter: AdapterRef, timeout_s: float = 5.0) -> str | None:
        """Ask the replica to bring `adapter` into its host tier now (`WarmResult.outcome`);
        None when it could not be asked (best effort: the first request fetches it anyway)."""
        body = WarmRequest(adapter=adapter).model_dump_json()
        try:
            resp = await self._http.post(
                f"{url}/adapters/warm",
                content=body,
                headers={**self._headers(), "content-type": "application/json"},
                timeout=timeout_s,
            )
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        try:
            return WarmResult.model_validate_json(resp.content).outcome
        except ValidationError:
            return None

    async def state(self, url: str, timeout_s: float = 1.0) -> ReplicaState:
        """The replica's `/state`; `ReplicaUnavailable` when it does not answer in the format."""
        try:
            resp = await self._http.get(f"{url}/state", headers=self._headers(), timeout=timeout_s)
        except (httpx.ReadTimeout, httpx.PoolTimeout) as exc:
            raise ReplicaSlow(f"replica {url} state: no answer in {timeout_s:g}s") from exc
        except httpx.HTTPError as exc:
            raise ReplicaUnavailable(f"replica {url} state: {exc}") from exc
        if resp.status_code != 200:
            raise ReplicaUnavailable(f"replica {url} state: HTTP {resp.status_code}")
        _check_version(url, resp.headers)
        try:
            return ReplicaState.model_validate_json(resp.content)
        except ValidationError as exc:
            raise _protocol_error(url, f"/state: {exc}") from None

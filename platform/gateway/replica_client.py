"""HTTP client for one engine replica's internal endpoint: `POST /generate` (a stream of
token deltas), `POST /abort/{request_id}`, `GET /state`.

Failures are sorted for the router: `ReplicaUnavailable` (could not connect, 5xx, stream
broke) may be retried on another replica if no token was sent yet; `ReplicaRejected` (4xx)
is the client's fault and is passed through with its status.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from loraplex.platform.gateway.errors import GatewayError


class ReplicaUnavailable(Exception):
    """The replica could not take or finish the request (dead, overloaded, broken stream)."""


class ReplicaRejected(GatewayError):
    """The replica refused the request as invalid (a 4xx): the client gets it as is."""


@dataclass
class GenerateRequest:
    """What the gateway sends a replica for one sequence."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: dict[str, Any]
    adapter: dict[str, Any] | None = None
    cache_salt: str | None = None

    def body(self) -> dict[str, Any]:
        """The JSON body of the replica's `POST /generate` (sampling fields at top level)."""
        return {
            "request_id": self.request_id,
            "prompt_token_ids": self.prompt_token_ids,
            "adapter": self.adapter,
            "cache_salt": self.cache_salt,
            "stream": True,
            **self.sampling_params,
        }


@dataclass
class TokenDelta:
    """New tokens of one sequence since the last delta (and, at the end, why it stopped)."""

    token_ids: list[int] = field(default_factory=list)
    text: str | None = None
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    error: str | None = None


def _logprobs(raw: Any) -> list[dict[int, float]] | None:
    if raw is None:
        return None
    out: list[dict[int, float]] = []
    for entry in raw:
        if isinstance(entry, dict):
            out.append({int(k): float(v) for k, v in entry.items()})
        elif isinstance(entry, list):  # [{"token_id", "logprob"}, ...] or [[id, logprob], ...]
            pairs = (
                (e["token_id"], e["logprob"]) if isinstance(e, dict) else (e[0], e[1])
                for e in entry
            )
            out.append({int(t): float(lp) for t, lp in pairs})
        else:
            out.append({})
    return out


def parse_delta(obj: dict[str, Any]) -> TokenDelta:
    """One streamed event of the replica as a `TokenDelta` (tolerates a few field spellings)."""
    ids = obj.get("token_ids")
    if ids is None:
        ids = obj.get("new_token_ids") or ([obj["token_id"]] if "token_id" in obj else [])
    err = obj.get("error")
    if isinstance(err, dict):
        err = err.get("message") or json.dumps(err)
    return TokenDelta(
        token_ids=[int(t) for t in ids],
        text=obj.get("text", obj.get("new_text")),
        logprobs=_logprobs(obj.get("logprobs", obj.get("new_logprobs"))),
        finish_reason=obj.get("finish_reason"),
        num_prompt_tokens=obj.get("num_prompt_tokens", obj.get("prompt_tokens")),
        num_cached_tokens=obj.get("num_cached_tokens", obj.get("cached_tokens")),
        error=err if isinstance(err, str) else None,
    )


def _rejection(status: int, raw: bytes) -> ReplicaRejected:
    message, param, code = raw.decode("utf-8", "replace")[:2000], None, None
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else {}
        if isinstance(err, dict):
            message = str(err.get("message") or err.get("detail") or message)
            param, code = err.get("param"), err.get("code")
        elif isinstance(body, dict) and "detail" in body:
            message = str(body["detail"])
    except (ValueError, AttributeError):
        pass
    code = (
        code if isinstance(code, str) else "not_implemented" if status == 501 else "invalid_value"
    )
    return ReplicaRejected(
        status, message, param=param if isinstance(param, str) else None, code=code
    )


class ReplicaClient:
    """Talks to replicas over one shared `httpx.AsyncClient`."""

    def __init__(self, http: httpx.AsyncClient, read_timeout_s: float = 120.0) -> None:
        self._http = http
        self._timeout = httpx.Timeout(connect=2.0, read=read_timeout_s, write=10.0, pool=10.0)

    async def generate(self, url: str, req: GenerateRequest) -> AsyncIterator[TokenDelta]:
        """Stream deltas of `req` from the replica at `url`."""
        try:
            async with self._http.stream(
                "POST", f"{url}/generate", json=req.body(), timeout=self._timeout
            ) as resp:
                if resp.status_code == 501:  # a feature this replica lacks: not retryable
                    raise _rejection(resp.status_code, await resp.aread())
                if resp.status_code >= 500 or resp.status_code == 429:
                    await resp.aread()
                    raise ReplicaUnavailable(f"replica {url} answered {resp.status_code}")
                if resp.status_code >= 400:
                    raise _rejection(resp.status_code, await resp.aread())
                async for line in resp.aiter_lines():
                    line = line.strip()
                    if line.startswith("data:"):
                        line = line[5:].strip()
                    if not line or line == "[DONE]" or line.startswith(":"):
                        continue
                    delta = parse_delta(json.loads(line))
                    if delta.error is not None:
                        raise ReplicaUnavailable(f"replica {url} failed: {delta.error}")
                    yield delta
        except httpx.HTTPError as exc:
            raise ReplicaUnavailable(f"replica {url}: {type(exc).__name__}: {exc}") from exc

    async def abort(self, url: str, request_id: str) -> None:
        """Ask the replica to drop `request_id` now (frees its KV blocks and adapter ref)."""
        # A dead replica has nothing left to free.
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(f"{url}/abort/{request_id}", timeout=2.0)

    async def state(self, url: str, timeout_s: float = 1.0) -> dict[str, Any]:
        """The replica's `/state` JSON; `ReplicaUnavailable` when it does not answer."""
        try:
            resp = await self._http.get(f"{url}/state", timeout=timeout_s)
            resp.raise_for_status()
            data = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ReplicaUnavailable(f"replica {url} state: {exc}") from exc
        return data if isinstance(data, dict) else {}

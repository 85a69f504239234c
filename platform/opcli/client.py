"""One HTTP client for the operator commands: where the API is (`--url` / LORAPLEX_URL), which
key to send (LORAPLEX_ADMIN_KEY or LORAPLEX_API_KEY), and the server's OpenAI-shaped error
turned into a `CliError` carrying its message."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "LORAPLEX_URL"
ADMIN_KEY_ENV = "LORAPLEX_ADMIN_KEY"
API_KEY_ENV = "LORAPLEX_API_KEY"
TIMEOUT_S = 60.0


class CliError(Exception):
    """A failure to show the operator as one line (the server's message when it sent one)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


def error_message(resp: httpx.Response) -> CliError:
    """The server's OpenAI-shaped error (`{"error": {"message", "code", ...}}`) as a CliError;
    the status line and body start when the body is not one."""
    try:
        err = resp.json().get("error")
    except ValueError:
        err = None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        code = err.get("code") if isinstance(err.get("code"), str) else None
        return CliError(err["message"], status=resp.status_code, code=code)
    text = resp.text.strip().splitlines()[0][:200] if resp.text.strip() else ""
    return CliError(
        f"HTTP {resp.status_code} from {resp.request.url}" + (f": {text}" if text else ""),
        status=resp.status_code,
    )


def adapter_path(name: str) -> str:
    """The tenant API path of an adapter (its name quoted)."""
    return f"/v1/adapters/{quote(name, safe='')}"


def resolve_url(url: str | None) -> str:
    """`--url`, else LORAPLEX_URL, else the local default; no trailing slash."""
    return (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def resolve_key(kind: str) -> str:
    """The admin or tenant key from the environment (CliError naming the variable if unset)."""
    var = ADMIN_KEY_ENV if kind == "admin" else API_KEY_ENV
    key = os.environ.get(var, "").strip()
    if not key:
        what = "the admin key" if kind == "admin" else "a tenant API key"
        raise CliError(f"{var} is not set: export {what} first (see `loraplex up`)")
    return key


class ApiClient:
    """Calls the API with a bearer key; every non-2xx answer raises CliError."""

    def __init__(self, url: str, key: str, *, timeout: float = TIMEOUT_S) -> None:
        self.url = url
        self.http = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; a connection failure or an error status becomes CliError."""
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach the API at {self.url}: {exc}") from None
        if resp.status_code >= 400:
            raise error_message(resp)
        return resp

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request whose answer is JSON."""
        return self.send(method, path, **kwargs).json()


def connect(url: str | None, kind: str) -> ApiClient:
    """An ApiClient for the admin (`kind="admin"`) or tenant (`kind="tenant"`) API."""
    return ApiClient(resolve_url(url), resolve_key(kind))


def guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command; a CliError prints `error: <message>` on stderr and exits 1."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CliError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1

    return run

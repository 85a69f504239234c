"""Every route of the app, read from its route table (so a new route is covered by default),
against the bodies and paths a hostile caller sends: deeply nested JSON, a NUL in every path
parameter, a body declared far over the limit. None is a 5xx; the JSON API answers each in
the OpenAI error shape with the right status."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from support.route_table import endpoints

NESTED = b"[" * 100_000
PARAM = re.compile(r"\{([^}:]+)(:[^}]+)?\}")
SKIP_PATHS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def _routes(app: Any) -> list[tuple[str, str]]:
    found = []
    for path, methods in endpoints(app.routes):
        if path in SKIP_PATHS or path.startswith("/console/static"):
            continue
        found += [(m, path) for m in sorted(methods) if m not in ("HEAD", "OPTIONS")]
    return found


def _fill(path: str, value: str) -> str:
    return PARAM.sub(value, path)


def _auth(path: str, cp_settings: Any, tenant_key: str) -> dict[str, str]:
    key = cp_settings.admin_key if path.startswith("/admin/") else tenant_key
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def _json_error(resp: Any) -> dict[str, Any]:
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    return body["error"]


@pytest.fixture(scope="module")
def tenant_key(client: TestClient, make_tenant: Any) -> str:
    return make_tenant()[1]["Authorization"].removeprefix("Bearer ")


def test_the_route_table_is_read(client: TestClient) -> None:
    routes = _routes(client.app)
    assert ("POST", "/v1/chat/completions") in routes and ("POST", "/admin/v1/tenants") in routes
    assert any(path.startswith("/console") for _, path in routes)
    assert any(isinstance(r, APIRoute) for r in client.app.routes)


def test_nested_json_to_every_body_route_is_a_400(
    client: TestClient, cp_settings: Any, tenant_key: str
) -> None:
    checked = 0
    for method, path in _routes(client.app):
        if method not in ("POST", "PUT", "PATCH"):
            continue
        url = _fill(path, "x")
        resp = client.request(
            method, url, content=NESTED, headers=_auth(path, cp_settings, tenant_key)
        )
        assert resp.status_code < 500, (method, path, resp.status_code, resp.text[:300])
        if path.startswith("/console"):
            continue  # forms with CSRF: a 4xx page in the console's own shape
        if path == "/v1/adapters" and method == "POST":
            assert resp.status_code == 400, resp.text  # not multipart
            continue
        assert resp.status_code in (400, 404, 422), (method, path, resp.status_code, resp.text)
        if resp.status_code != 404:  # 404: the route's resource check came first
            assert resp.status_code == 400, (method, path, resp.text)
        _json_error(resp)
        checked += 1
    assert checked >= 10


def test_a_nul_in_every_path_parameter_is_refused(
    client: TestClient, cp_settings: Any, tenant_key: str
) -> None:
    checked = 0
    for method, path in _routes(client.app):
        if "{" not in path:
            continue
        url = _fill(path, "a%00b")
        resp = client.request(method, url, headers=_auth(path, cp_settings, tenant_key))
        assert resp.status_code < 500, (method, path, resp.status_code, resp.text[:300])
        assert resp.status_code in (400, 401, 403, 404, 405, 422), (method, path, resp.text)
        if not path.startswith("/console"):
            assert resp.status_code == 400, (method, path, resp.text)
            assert _json_error(resp)["code"] == "invalid_name"
        checked += 1
    assert checked >= 10


def test_a_body_declared_over_the_limit_is_a_413_on_every_body_route(
    client: TestClient, cp_settings: Any, tenant_key: str
) -> None:
    for method, path in _routes(client.app):
        if method not in ("POST", "PUT", "PATCH"):
            continue
        headers = {
            **_auth(path, cp_settings, tenant_key),
            "Content-Length": str(2 << 30),
        }
        resp = client.request(method, _fill(path, "x"), content=b"", headers=headers)
        assert resp.status_code == 413, (method, path, resp.status_code, resp.text[:300])


NUL_BODY = {
    "name": "a\x00b", "model": "m\x00", "base_model": "b\x00", "prompt": "p\x00q",
    "messages": [{"role": "user", "content": "\x00"}], "email": "x\x00@y", "key\x00": 1,
}  # fmt: skip


def test_a_nul_in_every_body_is_never_a_5xx(
    client: TestClient, cp_settings: Any, tenant_key: str
) -> None:
    checked = 0
    for method, path in _routes(client.app):
        if method not in ("POST", "PUT", "PATCH"):
            continue
        resp = client.request(
            method, _fill(path, "x"), json=NUL_BODY, headers=_auth(path, cp_settings, tenant_key)
        )
        assert resp.status_code < 500, (method, path, resp.status_code, resp.text[:300])
        if not path.startswith("/console") and resp.status_code >= 400:
            _json_error(resp)
        checked += 1
    assert checked >= 10


HOSTILE_HEADERS = {  # raw bytes: HTTP carries them as latin-1
    "X-Request-Id": b"r" * 100_000,
    "X-Loraplex-Deployment": b"\x7f" * 5_000,
    "Idempotency-Key": b"\xff" * 300,
    "Accept-Language": b"\x01" * 64,
    "Cookie": b"lpx_session=" + b"\xfe" * 4096,
}


def test_hostile_headers_on_every_route_are_never_a_5xx(
    client: TestClient, cp_settings: Any, tenant_key: str
) -> None:
    """Very long and control- or high-byte header values (what HTTP lets through; a NUL ends
    a header line on the wire), on every route: 4xx at most, OpenAI-shaped on the JSON API,
    and no echo of a huge value."""
    for method, path in _routes(client.app):
        headers = {**_auth(path, cp_settings, tenant_key), **HOSTILE_HEADERS}
        body = {"model": "m", "prompt": "hi"} if method in ("POST", "PUT", "PATCH") else None
        resp = client.request(method, _fill(path, "x"), json=body, headers=headers)
        assert resp.status_code < 500, (method, path, resp.status_code, resp.text[:300])
        assert len(resp.content) < 20_000, (method, path, len(resp.content))
        if not path.startswith("/console") and resp.status_code >= 400:
            _json_error(resp)

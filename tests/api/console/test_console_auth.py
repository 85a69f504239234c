"""Console sign-in: the admin key creates the first owner once; email + password sessions
with an HttpOnly SameSite cookie, idle expiry and sign-out; CSRF on every POST; viewers
read only; sign-in failures rate-limited; every action audited with its operator."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import func, select
from support.console import PASSWORD, csrf_of, make_operator, page_csrf, sign_in

from loraplex.platform.db.models import AuditLog, Operator, Tenant
from loraplex.platform.db.session import make_sessionmaker


def _count(url: str, model: Any, *where: Any) -> int:
    with make_sessionmaker(url)() as s:
        return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def test_pages_need_a_session(new_client) -> None:
    c = new_client()
    for path in ("/console/", "/console/tenants", "/console/audit", "/console/api/usage-series"):
        r = c.get(path, follow_redirects=False)
        assert r.status_code in (303, 401), (path, r.status_code)
        if r.status_code == 303:
            assert r.headers["location"] == "/console/sign-in"


def test_first_owner_with_the_admin_key_once(new_client, console_settings) -> None:
    url = console_settings.database_url
    assert _count(url, Operator) == 0
    c = new_client()
    page = c.get("/console/sign-in")
    assert "First sign-in" in page.text
    token = csrf_of(page.text)
    bad = c.post("/console/first-owner", data={"admin_key": "nope", "email": "o@example.com",
                 "password": PASSWORD, "csrf_token": token}, follow_redirects=False)  # fmt: skip
    assert bad.status_code == 401 and _count(url, Operator) == 0
    ok = c.post(
        "/console/first-owner",
        data={"admin_key": console_settings.admin_key, "email": "Owner@Example.com",
              "password": PASSWORD, "csrf_token": token},
        follow_redirects=False,
    )  # fmt: skip
    assert ok.status_code == 303, ok.text
    cookie = ok.headers["set-cookie"]
    assert "lp_console=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Secure" not in cookie  # plain http here; https adds it (below)
    assert c.get("/console/").status_code == 200
    assert (
        _count(url, Operator, Operator.email == "owner@example.com", Operator.role == "owner") == 1
    )
    # Once an operator exists the admin key creates no one.
    again = new_client()
    p2 = again.get("/console/sign-in")
    assert "First sign-in" not in p2.text
    r = again.post(
        "/console/first-owner",
        data={"admin_key": console_settings.admin_key, "email": "x@example.com",
              "password": PASSWORD, "csrf_token": csrf_of(p2.text)},
    )  # fmt: skip
    assert r.status_code == 409 and _count(url, Operator) == 1


def test_secure_cookie_over_https(new_client, console_settings) -> None:
    make_operator(console_settings.database_url, "tls@example.com", "viewer")
    c = new_client()
    page = c.get("/console/sign-in")
    r = c.post(
        "/console/sign-in",
        data={"email": "tls@example.com", "password": PASSWORD, "csrf_token": csrf_of(page.text)},
        headers={"x-forwarded-proto": "https"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and "Secure" in r.headers["set-cookie"]


def test_sign_in_without_the_form_token_is_refused(new_client, console_settings) -> None:
    make_operator(console_settings.database_url, "nocsrf@example.com", "operator")
    c = new_client()
    c.get("/console/sign-in")
    r = c.post("/console/sign-in", data={"email": "nocsrf@example.com", "password": PASSWORD},
               follow_redirects=False)  # fmt: skip
    assert r.status_code == 403


def test_post_without_csrf_is_refused_and_changes_nothing(new_client, console_settings) -> None:
    url = console_settings.database_url
    make_operator(url, "op-csrf@example.com", "operator")
    c = new_client()
    assert sign_in(c, "op-csrf@example.com").status_code == 303
    name = f"csrf-{uuid.uuid4().hex[:6]}"
    r = c.post("/console/tenants", data={"name": name})
    assert r.status_code == 403 and "security token" in r.text
    r = c.post("/console/tenants", data={"name": name, "csrf_token": "wrong"})
    assert r.status_code == 403
    assert _count(url, Tenant, Tenant.name == name) == 0
    ok = c.post("/console/tenants", data={"name": name, "csrf_token": page_csrf(c)})
    assert ok.status_code == 200 and _count(url, Tenant, Tenant.name == name) == 1


def test_viewer_reads_but_cannot_change(new_client, console_settings) -> None:
    url = console_settings.database_url
    make_operator(url, "viewer@example.com", "viewer")
    c = new_client()
    assert sign_in(c, "viewer@example.com").status_code == 303
    assert c.get("/console/tenants").status_code == 200
    token = page_csrf(c, "/console/")
    before = _count(url, Tenant)
    audit_before = _count(url, AuditLog)
    r = c.post("/console/tenants", data={"name": "viewer-made", "csrf_token": token})
    assert r.status_code == 403
    assert _count(url, Tenant) == before and _count(url, AuditLog) == audit_before


def test_actions_are_audited_with_the_operator(new_client, console_settings) -> None:
    url = console_settings.database_url
    make_operator(url, "auditor@example.com", "operator")
    c = new_client()
    sign_in(c, "auditor@example.com")
    name = f"aud-{uuid.uuid4().hex[:6]}"
    assert (
        c.post("/console/tenants", data={"name": name, "csrf_token": page_csrf(c)}).status_code
        == 200
    )
    with make_sessionmaker(url)() as s:
        row = s.execute(
            select(AuditLog, Operator.email)
            .join(Operator, Operator.id == AuditLog.operator_id)
            .where(AuditLog.action == "tenant.create", AuditLog.detail["name"].astext == name)
        ).one()
    assert row.email == "auditor@example.com"
    assert row.AuditLog.actor == "operator:auditor@example.com"
    page = c.get("/console/audit", params={"actor": "auditor"})
    assert name in page.text and "auditor@example.com" in page.text


def test_sign_out_ends_the_session(new_client, console_settings) -> None:
    make_operator(console_settings.database_url, "leaver@example.com", "viewer")
    c = new_client()
    sign_in(c, "leaver@example.com")
    cookie = c.cookies.get("lp_console")
    token = page_csrf(c, "/console/")
    assert (
        c.post("/console/sign-out", data={"csrf_token": token}, follow_redirects=False).status_code
        == 303
    )
    thief = new_client()
    thief.cookies.set("lp_console", cookie, path="/console")
    assert thief.get("/console/", follow_redirects=False).status_code == 303


def test_idle_sessions_expire(console_settings) -> None:
    from fastapi.testclient import TestClient

    from loraplex.api.app import create_app

    make_operator(console_settings.database_url, "idle@example.com", "viewer")
    app = create_app(console_settings.model_copy(update={"console_idle_timeout_s": 1}))
    with TestClient(app) as c:
        sign_in(c, "idle@example.com")
        assert c.get("/console/", follow_redirects=False).status_code == 200
        time.sleep(2.2)
        assert c.get("/console/", follow_redirects=False).status_code == 303


def test_wrong_passwords_are_rate_limited(new_client, console_settings) -> None:
    make_operator(console_settings.database_url, "target@example.com", "owner")
    c = new_client()
    codes = [sign_in(c, "target@example.com", "wrong password 123").status_code for _ in range(5)]
    assert codes[0] == 401 and codes[-1] == 429  # 4 failures allowed per window (this module)
    assert codes.index(429) <= 4 and set(codes[codes.index(429) :]) == {429}
    blocked = sign_in(c, "target@example.com")  # even the right password, for now
    assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1

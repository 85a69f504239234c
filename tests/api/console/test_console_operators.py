"""The Operators page: an owner invites (a one-time link that sets the password and signs in),
changes roles, disables (sessions end at once) and resets passwords; the last owner cannot be
demoted or disabled; only owners manage operators."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from support.console import PASSWORD, csrf_of, make_operator, page_csrf, sign_in

from loraplex.platform.db.models import Operator
from loraplex.platform.db.session import make_sessionmaker

OWNER = "boss@example.com"
LINK_RE = re.compile(r'id="one-time-link" class="secret">([^<]+)<')


def _id(url: str, email: str) -> str:
    with make_sessionmaker(url)() as s:
        return str(s.scalars(select(Operator.id).where(Operator.email == email)).one())


@pytest.fixture(scope="module")
def boss(console_app: Any, console_settings: Any):
    make_operator(console_settings.database_url, OWNER, "owner")
    c = TestClient(console_app, raise_server_exceptions=False)
    assert sign_in(c, OWNER).status_code == 303
    c.csrf = page_csrf(c, "/console/operators")  # type: ignore[attr-defined]
    yield c
    c.close()


def _invite(boss: Any, email: str, role: str) -> str:
    r = boss.post(
        "/console/operators", data={"email": email, "role": role, "csrf_token": boss.csrf}
    )
    assert r.status_code == 201, r.text[-500:]
    found = LINK_RE.search(r.text)
    assert found, "no one-time link shown"
    return found.group(1)


def _use_link(console_app: Any, link: str, password: str = PASSWORD) -> Any:
    c = TestClient(console_app, raise_server_exceptions=False)
    path = "/console/" + link.split("/console/", 1)[1]
    page = c.get(path)
    assert page.status_code == 200, page.text[-300:]
    r = c.post(path, data={"password": password, "csrf_token": csrf_of(page.text)},
               follow_redirects=False)  # fmt: skip
    return c, r


def test_the_last_owner_is_kept(boss: Any, console_settings: Any) -> None:
    me = _id(console_settings.database_url, OWNER)
    r = boss.post(f"/console/operators/{me}/role", data={"role": "viewer", "csrf_token": boss.csrf})
    assert r.status_code == 409 and "last owner" in r.text
    r = boss.post(f"/console/operators/{me}/disable",
                  data={"action": "disable", "csrf_token": boss.csrf})  # fmt: skip
    assert r.status_code == 409
    assert boss.get("/console/operators").status_code == 200  # still signed in, still owner


def test_invite_link_sets_the_password_once_and_signs_in(
    boss: Any, console_app: Any, console_settings: Any
) -> None:
    link = _invite(boss, "new-op@example.com", "operator")
    assert link not in boss.get("/console/operators").text  # shown once
    c, r = _use_link(console_app, link)
    assert r.status_code == 303 and r.headers["location"] == "/console/"
    assert c.get("/console/tenants").status_code == 200
    again = TestClient(console_app, raise_server_exceptions=False)
    assert again.get("/console/" + link.split("/console/", 1)[1]).status_code == 404  # spent
    assert sign_in(again, "new-op@example.com").status_code == 303
    # An operator may change tenants but not operators.
    token = page_csrf(c, "/console/operators")
    r = c.post("/console/operators", data={"email": "x@example.com", "role": "owner",
               "csrf_token": token})  # fmt: skip
    assert r.status_code == 403


def test_role_change_disable_and_reset(boss: Any, console_app: Any, console_settings: Any) -> None:
    url = console_settings.database_url
    make_operator(url, "second@example.com", "operator")
    other = TestClient(console_app, raise_server_exceptions=False)
    assert sign_in(other, "second@example.com").status_code == 303
    oid = _id(url, "second@example.com")
    r = boss.post(f"/console/operators/{oid}/role", data={"role": "owner", "csrf_token": boss.csrf})
    assert r.status_code == 200 and "second@example.com is now owner" in r.text
    # Two owners: one of them may be disabled; their session ends at once.
    r = boss.post(f"/console/operators/{oid}/disable",
                  data={"action": "disable", "csrf_token": boss.csrf})  # fmt: skip
    assert r.status_code == 200 and "disabled" in r.text
    assert other.get("/console/", follow_redirects=False).status_code == 303
    assert sign_in(TestClient(console_app), "second@example.com").status_code == 401
    boss.post(
        f"/console/operators/{oid}/disable", data={"action": "enable", "csrf_token": boss.csrf}
    )
    # Reset: the old password stops working; the link sets a new one.
    r = boss.post(f"/console/operators/{oid}/reset", data={"csrf_token": boss.csrf})
    assert r.status_code == 200
    link = LINK_RE.search(r.text).group(1)  # type: ignore[union-attr]
    assert sign_in(TestClient(console_app), "second@example.com").status_code == 401
    _, done = _use_link(console_app, link, "a brand new password 42")
    assert done.status_code == 303
    fresh = TestClient(console_app)
    assert sign_in(fresh, "second@example.com", "a brand new password 42").status_code == 303
    page = boss.get("/console/audit", params={"action": "operator."}).text
    for action in (
        "operator.role",
        "operator.disable",
        "operator.enable",
        "operator.reset_password",
    ):
        assert action in page

"""Console helpers for tests: sign in through the real forms (TestClient or any httpx-like
client), read a page's CSRF token, create operators straight through the service."""

from __future__ import annotations

import re
from typing import Any

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
PASSWORD = "correct horse battery staple"


def csrf_of(html: str) -> str:
    """The first CSRF token in a page's forms."""
    found = CSRF_RE.search(html)
    assert found, "no csrf_token field on the page"
    return found.group(1)


def make_operator(database_url: str, email: str, role: str, password: str = PASSWORD) -> None:
    """Create an operator account through the service (as `loraplex admin create-user` does)."""
    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.services.operators import create_operator

    with session_scope(make_sessionmaker(database_url)) as session:
        create_operator(session, email, password, role, actor="test")


def sign_in(client: Any, email: str, password: str = PASSWORD) -> Any:
    """Sign in through the form (the sign-in page first, for its double-submit token);
    returns the POST's response (303 on success)."""
    page = client.get("/console/sign-in")
    assert page.status_code == 200, page.text
    return client.post(
        "/console/sign-in",
        data={"email": email, "password": password, "csrf_token": csrf_of(page.text)},
        follow_redirects=False,
    )


def page_csrf(client: Any, path: str = "/console/tenants") -> str:
    """The signed-in session's CSRF token, read from a page."""
    resp = client.get(path)
    assert resp.status_code == 200, resp.text
    return csrf_of(resp.text)

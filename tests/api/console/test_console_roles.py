"""Every mutating console route refuses a viewer, read from the app's route table, so a route
added later is covered without touching this test; an owner sending the same request is not
refused for its role (so a 403 here means the role check, not a bad request)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from support.console import make_operator, page_csrf, sign_in
from support.route_table import endpoints

from loraplex.platform.db.models import AuditLog
from loraplex.platform.db.session import make_sessionmaker

# Sign-in forms and the one-time set-password link (no session yet), and sign-out (any role
# may end its own session).
NOT_WRITES = {
    "/console/sign-in",
    "/console/first-owner",
    "/console/sign-out",
    "/console/set-password/{token}",  # a one-time link, before any session
}


def mutating_routes(app: Any) -> list[str]:
    """Paths of the console's POST/PUT/PATCH/DELETE routes, path parameters left in."""
    return sorted(
        path
        for path, methods in endpoints(app.routes)
        if path.startswith("/console/")
        and methods & {"POST", "PUT", "PATCH", "DELETE"}
        and path not in NOT_WRITES
    )


def _filled(path: str) -> str:
    return re.sub(r"\{[^}]+\}", lambda _: str(uuid.uuid4()), path)


@pytest.fixture(scope="module")
def clients(console_app: Any, console_settings: Any):
    url = console_settings.database_url
    made = {}
    for role in ("viewer", "owner"):
        email = f"{role}-routes@example.com"
        make_operator(url, email, role)
        c = TestClient(console_app, raise_server_exceptions=False)
        assert sign_in(c, email).status_code == 303
        c.csrf = page_csrf(c, "/console/")  # type: ignore[attr-defined]
        made[role] = c
    yield made
    for c in made.values():
        c.close()


def test_the_route_table_has_the_mutating_routes(console_app: Any) -> None:
    routes = mutating_routes(console_app)
    assert len(routes) >= 10, routes
    assert "/console/tenants" in routes and "/console/jobs/{job_id}/retry" in routes
    assert "/console/adapters/{adapter_id}/drafts/{draft_id}/delete" in routes


def test_viewer_is_refused_on_every_mutating_route(
    console_app: Any, console_settings: Any, clients: dict
) -> None:
    url = console_settings.database_url

    def audit_rows() -> int:
        with make_sessionmaker(url)() as s:
            return int(s.scalar(select(func.count()).select_from(AuditLog)) or 0)

    before = audit_rows()
    wrong = {}
    for path in mutating_routes(console_app):
        target = _filled(path)
        form = {"csrf_token": clients["viewer"].csrf, "name": "viewer-made", "replicas": "1"}
        viewer = clients["viewer"].post(target, data=form, follow_redirects=False)
        form["csrf_token"] = clients["owner"].csrf
        owner = clients["owner"].post(target, data=form, follow_redirects=False)
        if (
            viewer.status_code != 403
            or "read_only_role" not in viewer.text
            or owner.status_code == 403
        ):
            wrong[path] = (viewer.status_code, owner.status_code)
    assert wrong == {}, "viewer status, owner status per route"
    assert audit_rows() == before + 1  # only the owner's tenant creation was recorded

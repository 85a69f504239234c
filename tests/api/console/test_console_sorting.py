"""Sorting a paged table sorts the whole result in the database, then pages it: the first row
of page 1 is the first of every matching row, page 2 goes on from there, the headers are links
that say how the table is sorted, the pager keeps the order, and an unknown sort key is a 400
naming it. Tenants, adapter versions, jobs and the audit log, over a real control plane."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.console import make_operator, sign_in
from support.gateway_catalog import add_adapter_version, seed_catalog

from loraplex.platform.db.models import AuditLog, Job, Tenant
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services import api_keys

ROWS = 55  # more than one page (50)


@pytest.fixture(scope="module")
def viewer(console_app: Any, console_settings: Any):
    make_operator(console_settings.database_url, "sorter@example.com", "viewer")
    c = TestClient(console_app, raise_server_exceptions=False)
    assert sign_in(c, "sorter@example.com").status_code == 303
    yield c
    c.close()


@pytest.fixture(scope="module")
def seeded(console_settings: Any) -> dict[str, Any]:
    """55 tenants (the fourth with two keys), 55 versions of growing size, 55 jobs with 0..54
    attempts, 55 audit rows by actors sorter-00..54."""
    tag = uuid.uuid4().hex[:6]
    with session_scope(make_sessionmaker(console_settings.database_url)) as s:
        tenants = [Tenant(id=uuid.uuid4(), name=f"srt{tag}-{i:02d}") for i in range(ROWS)]
        s.add_all(tenants)
        s.flush()
        for _ in range(2):
            api_keys.create_api_key(s, tenants[3].id, "k", actor="test")
        base, _ = seed_catalog(s, f"srt{tag}-base")
        for i in range(ROWS):
            _, v = add_adapter_version(s, tenants[0].id, base, f"bot-{(i * 7) % ROWS:02d}")
            v.bytes = 1000 + 101 * i
        s.add_all(Job(tenant_id=tenants[0].id, kind="validate_adapter_version", status="failed",
                      attempts=i) for i in range(ROWS))  # fmt: skip
        s.add_all(AuditLog(actor=f"sorter{tag}-{i:02d}", action="tenant.create",
                           resource_type="tenant", resource_id="x") for i in range(ROWS))  # fmt: skip
    return {"tag": tag, "tenant0": f"srt{tag}-00"}


def _rows(html: str) -> list[list[str]]:
    """The text of each cell of each row of the page's first table body."""
    body = html[html.index("<tbody>") : html.index("</tbody>")]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in rows]  # fmt: skip


def _get(client: TestClient, path: str, **params: Any) -> str:
    r = client.get(path, params=params)
    assert r.status_code == 200, r.text[-400:]
    return r.text


def test_tenants_sort_across_pages(viewer: TestClient, seeded: dict[str, Any]) -> None:
    q = f"srt{seeded['tag']}-"
    page = _get(viewer, "/console/tenants", q=q, sort="name", dir="desc")
    assert _rows(page)[0][0] == f"{q}54"  # the last name of all 55, not of the first page
    assert 'aria-sort="descending"' in page
    assert re.search(r'href="/console/tenants\?[^"]*sort=name&amp;dir=desc[^"]*page=2"', page)
    second = _rows(_get(viewer, "/console/tenants", q=q, sort="name", dir="desc", page=2))
    assert [r[0] for r in second] == [f"{q}{i:02d}" for i in (4, 3, 2, 1, 0)]
    by_keys = _rows(_get(viewer, "/console/tenants", q=q, sort="keys", dir="desc"))
    assert by_keys[0][0] == f"{q}03" and by_keys[0][2] == "2"


def test_adapter_versions_sort_across_pages(viewer: TestClient, seeded: dict[str, Any]) -> None:
    t = seeded["tenant0"]
    small = _rows(_get(viewer, "/console/adapters", tenant=t, sort="size", dir="asc"))
    assert small[0][7] == "1000 B"
    big = _rows(_get(viewer, "/console/adapters", tenant=t, sort="size", dir="desc"))
    assert big[0][7] == "6.3 KiB" and big[0][1] == f"bot-{(54 * 7) % ROWS:02d}"
    names = _rows(_get(viewer, "/console/adapters", tenant=t, sort="adapter", dir="asc"))
    assert names[0][1] == "bot-00"


def test_jobs_and_audit_sort_across_pages(viewer: TestClient, seeded: dict[str, Any]) -> None:
    jobs = _rows(_get(viewer, "/console/jobs", sort="attempts", dir="desc"))
    assert jobs[0][4] == "54"
    audit = _rows(_get(viewer, "/console/audit", actor=f"sorter{seeded['tag']}", sort="actor",
                       dir="desc"))  # fmt: skip
    assert audit[0][1] == f"sorter{seeded['tag']}-54"


def test_an_unknown_sort_is_refused_by_name(viewer: TestClient) -> None:
    for path in ("/console/tenants", "/console/adapters", "/console/jobs", "/console/audit"):
        r = viewer.get(path, params={"sort": "password_hash"})
        assert r.status_code == 400 and "password_hash" in r.text, path
        r = viewer.get(path, params={"dir": "sideways"})
        assert r.status_code == 400 and "sideways" in r.text, path

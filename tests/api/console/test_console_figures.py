"""The console's figures are true: a validation that failed shows as failed with its reason, a
tenant's 30-day chart spans those 30 days, refused requests count as requests and errors,
the error rate is a percentage, a key's last use is current, and every page names its icon."""

from __future__ import annotations

import html
import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from support.console import make_operator, page_csrf, sign_in
from support.uploads import service_uploader, upload_through_service
from support.waiting import wait_until

from loraplex.platform.db.models import AdapterVersion, ApiKey, Job, UsageRecord
from loraplex.platform.db.session import make_sessionmaker, session_scope


@pytest.fixture(scope="module")
def owner(console_app: Any, console_settings: Any):
    make_operator(console_settings.database_url, "figures@example.com", "owner")
    c = TestClient(console_app, raise_server_exceptions=False)
    assert sign_in(c, "figures@example.com").status_code == 303
    c.csrf = page_csrf(c)  # type: ignore[attr-defined]
    yield c
    c.close()


def _tenant(owner: Any, name: str) -> str:
    r = owner.post("/console/tenants", data={"name": name, "csrf_token": owner.csrf},
                   follow_redirects=False)  # fmt: skip
    assert r.status_code == 303, r.text
    return r.headers["location"].split("/")[3].split("?")[0]


def _key(owner: Any, tid: str) -> str:
    r = owner.post(f"/console/tenants/{tid}/keys", data={"name": "k", "csrf_token": owner.csrf})
    assert r.status_code == 201, r.text
    start = r.text.index('id="new-key-secret"')
    return r.text[r.text.index(">", start) + 1 : r.text.index("</output>", start)]


def _row_with(page: str, needle: str) -> str:
    body = page.split("<tbody>", 1)[1]
    rows = [r for r in body.split("<tr") if needle in r]
    assert rows, f"no row with {needle!r}"
    return rows[0]


def test_jobs_page_shows_a_failed_validation_as_failed_with_its_reason(
    owner: Any, console_settings: Any, base_model: str, adapter_r4: Any
) -> None:
    name = f"jobfail-{uuid.uuid4().hex[:6]}"
    tid = _tenant(owner, name)
    up = service_uploader(console_settings, uuid.UUID(tid), queue="nobody-reads-this")
    version = upload_through_service(up, "broken", base_model, adapter_r4)
    reason = "rank 16 is over max_lora_rank 8 <of the deployment>"
    with session_scope(make_sessionmaker(console_settings.database_url)) as s:
        v = s.get(AdapterVersion, version.id)
        v.status, v.error = "failed", reason
        job = s.scalars(select(Job).where(Job.subject_id == version.id)).one()
        job.status, job.finished_at = "succeeded", datetime.now(UTC)
    row = _row_with(owner.get("/console/jobs").text, name)
    assert "succeeded" not in row
    assert "failed" in row and html.escape(reason) in row


def _usage_doc(page: str) -> dict:
    found = re.search(r'data-usage="([^"]*)"', page)
    assert found, "no usage chart on the page"
    return json.loads(html.unescape(found.group(1)))


def test_tenant_usage_chart_spans_the_last_30_days(owner: Any, console_settings: Any) -> None:
    tid = _tenant(owner, f"chart-{uuid.uuid4().hex[:6]}")
    now = datetime.now(UTC)
    with session_scope(make_sessionmaker(console_settings.database_url)) as s:
        for ago in (3, 0):
            s.add(UsageRecord(tenant_id=uuid.UUID(tid), model="m", prompt_tokens=1,
                              completion_tokens=2, created_at=now - timedelta(days=ago)))  # fmt: skip
    doc = _usage_doc(owner.get(f"/console/tenants/{tid}").text)
    today = int(now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp())
    assert doc["t"][-1] == today and doc["t"][0] == today - 29 * 86400
    assert len(doc["t"]) == 30 and doc["x_range"] == [doc["t"][0], doc["t"][-1]]
    values = doc["series"][0]["values"]
    assert values[-1] == 1 and values[-4] == 1 and sum(values) == 2  # every other day is a 0


def _series(client: Any) -> dict:
    return client.get("/console/api/usage-series", params={"window": "hour"}).json()["series"]


def test_refused_requests_count_as_requests_and_errors(
    owner: Any, console_app: Any, console_settings: Any
) -> None:
    """401, 404 and 400 answers of the inference routes are in the per-minute charts, and the
    error rate is a percentage of the minute's requests."""
    tid = _tenant(owner, f"refused-{uuid.uuid4().hex[:6]}")
    key = _key(owner, tid)
    before = _series(owner)
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(console_app, raise_server_exceptions=False) as api:  # the gateway runs
        for headers, payload, status in (
            ({"Authorization": "Bearer lp_wrong"}, body, 401),
            ({}, body, 401),
            ({"Authorization": f"Bearer {key}"}, body, 404),
            ({"Authorization": f"Bearer {key}"}, {"model": "x"}, 400),
        ):
            r = api.post("/v1/chat/completions", headers=headers, json=payload)
            assert r.status_code == status, r.text

    def counted() -> dict | None:
        s = _series(owner)
        return s if sum(s["requests"]) >= sum(before["requests"]) + 4 else None

    after = wait_until(counted, timeout=20, what="the refusals in the chart data")
    assert sum(after["errors"]) >= sum(before["errors"]) + 4
    minute = max(range(len(after["t"])), key=lambda i: after["errors"][i])
    pct = 100 * after["errors"][minute] / after["requests"][minute]
    assert after["error_pct"][minute] == pytest.approx(pct, abs=0.01)
    assert after["error_pct"][minute] > 1  # a percentage, not a fraction


def test_a_keys_last_use_is_current(owner: Any, console_app: Any, console_settings: Any) -> None:
    tid = _tenant(owner, f"lastuse-{uuid.uuid4().hex[:6]}")
    key = _key(owner, tid)
    factory = make_sessionmaker(console_settings.database_url)

    def last_used() -> datetime | None:
        with factory() as s:
            return s.scalars(select(ApiKey.last_used_at).where(ApiKey.tenant_id == uuid.UUID(tid))).one()  # fmt: skip

    body = {"model": "no-such-model", "prompt": "hi"}
    with TestClient(console_app, raise_server_exceptions=False) as api:
        api.post("/v1/completions", headers={"Authorization": f"Bearer {key}"}, json=body)
        first = last_used()
        time.sleep(2.2)
        api.post("/v1/completions", headers={"Authorization": f"Bearer {key}"}, json=body)
        second = last_used()
    assert first is not None and second is not None
    assert second - first >= timedelta(seconds=2)


def test_every_page_names_its_icon(owner: Any, new_client: Any) -> None:
    """A page without `<link rel="icon">` makes the browser ask for /favicon.ico (a 404 in
    its console on every page)."""
    pages = [owner.get(p).text for p in ("/console/", "/console/tenants", "/console/jobs")]
    pages.append(new_client().get("/console/sign-in").text)
    for page in pages:
        found = re.search(r'<link rel="icon"[^>]* href="([^"]+)"', page)
        assert found, page[:400]
        icon = owner.get(found.group(1))
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/")

"""The detail pages: request lookup by id (what the tenant saw and the detail it did not, the
retention purge), an adapter across its versions (validation report, failure reason, usage and
its own TTFT), a deployment with its audit trail."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from support.console import make_operator, page_csrf, sign_in
from support.gateway_catalog import add_adapter_version
from support.waiting import wait_until

from loraplex.platform.db.models import Deployment, RequestLog, UsageRecord
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services import request_log


@pytest.fixture(scope="module")
def owner(console_app: Any, console_settings: Any):
    make_operator(console_settings.database_url, "details@example.com", "owner")
    c = TestClient(console_app, raise_server_exceptions=False)
    assert sign_in(c, "details@example.com").status_code == 303
    c.csrf = page_csrf(c)  # type: ignore[attr-defined]
    yield c
    c.close()


def _tenant(owner: Any, name: str) -> str:
    r = owner.post("/console/tenants", data={"name": name, "csrf_token": owner.csrf},
                   follow_redirects=False)  # fmt: skip
    return r.headers["location"].split("/")[3].split("?")[0]


def _key(owner: Any, tid: str) -> str:
    r = owner.post(
        f"/console/tenants/{tid}/keys", data={"name": "lookup", "csrf_token": owner.csrf}
    )
    start = r.text.index('id="new-key-secret"')
    return r.text[r.text.index(">", start) + 1 : r.text.index("</output>", start)]


def test_request_lookup_finds_a_refused_request(owner: Any, console_app: Any) -> None:
    name = f"lookup-{uuid.uuid4().hex[:6]}"
    tid = _tenant(owner, name)
    key = _key(owner, tid)
    with TestClient(console_app, raise_server_exceptions=False) as api:
        r = api.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                     json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    console_app.state.gateway = None  # closed with its event loop: later tests run without one
    assert r.status_code == 404
    rid = r.headers["x-request-id"]
    page = wait_until(lambda: (p := owner.get("/console/requests", params={"id": rid})).status_code == 200 and p,
                      timeout=20, what="the request in the log")  # fmt: skip
    for shown in (name, key[:8], "404", "model_not_found", "/v1/chat/completions", "nope"):
        assert shown in page.text, shown
    missing = owner.get("/console/requests", params={"id": "req_never"})
    assert missing.status_code == 404 and "Nothing logged" in missing.text


def test_lookup_shows_the_detail_and_old_entries_are_purged(
    owner: Any, console_settings: Any
) -> None:
    factory = make_sessionmaker(console_settings.database_url)
    now = datetime.now(UTC)
    entries = [
        request_log.Entry("req_detail", now, "POST", "/v1/completions", 503, 12,
                          "no_replica_available", "No replica is available",
                          detail="replica r-1 at 10.0.0.5:9000 refused"),
        request_log.Entry("req_old", now - timedelta(days=8), "POST", "/v1/completions", 429, 1),
    ]  # fmt: skip
    with session_scope(factory) as s:
        request_log.write(s, entries)
    page = owner.get("/console/requests", params={"id": "req_detail"}).text
    assert "replica r-1 at 10.0.0.5:9000 refused" in page and "No replica is available" in page
    with session_scope(factory) as s:
        assert (
            request_log.purge(s, timedelta(days=console_settings.request_log_retention_days)) >= 1
        )
    with factory() as s:
        ids = set(s.scalars(select(RequestLog.request_id)))
    assert "req_old" not in ids and "req_detail" in ids


def test_adapter_page_versions_report_and_latency(
    owner: Any, console_settings: Any, base_model: str
) -> None:
    tid = uuid.UUID(_tenant(owner, f"adp-{uuid.uuid4().hex[:6]}"))
    factory = make_sessionmaker(console_settings.database_url)
    with session_scope(factory) as s:
        adapter, good = add_adapter_version(s, tid, base_model, "detail-bot")
        good.rank, good.targets = (
            4,
            {
                "format": 1,
                "groups": [
                    {
                        "rank": 4,
                        "alpha": 8.0,
                        "scale": 2.0,
                        "layers": {"q_proj": [0, 1], "v_proj": [0, 1]},
                    }
                ],
            },
        )
        _, bad = add_adapter_version(s, tid, base_model, "detail-bot", "failed")
        bad.error = "rank 16 is over max_lora_rank 8"
        for ttft in (100, 200, 300, 400):
            s.add(UsageRecord(tenant_id=tid, model="detail-bot", prompt_tokens=5,
                              completion_tokens=7, adapter_version_id=good.id, ttft_ms=ttft))  # fmt: skip
        aid = adapter.id
    page = owner.get(f"/console/adapters/{aid}")
    assert page.status_code == 200, page.text[-500:]
    text = page.text
    assert "All checks passed" in text and "q_proj: 2 layers, rank 4" in text
    assert "rank 16 is over max_lora_rank 8" in text
    assert "250 ms" in text  # TTFT p50 of 100..400
    assert '<td class="num">4</td><td class="num">0</td><td class="num">20</td>' in text
    days = "0, " * 29 + "4"  # its chart: 4 requests today, none before
    assert "{&#34;label&#34;: &#34;requests&#34;, &#34;values&#34;: [" + days + "]}" in text
    assert owner.get(f"/console/adapters/{uuid.uuid4()}").status_code == 404


def test_deployment_page_has_its_audit_trail(
    owner: Any, console_settings: Any, base_model: str
) -> None:
    r = owner.post("/console/deployments", data={"name": "dep-detail", "base_model": base_model,
                   "weights": "fp32", "kv_cache": "auto", "replicas": "1", "csrf_token": owner.csrf})  # fmt: skip
    assert r.status_code == 200, r.text[-300:]
    with make_sessionmaker(console_settings.database_url)() as s:
        dep_id = s.scalars(select(Deployment.id).where(Deployment.name == "dep-detail")).one()
        assert s.scalar(select(func.count()).select_from(Deployment)) >= 1
    owner.post(
        f"/console/deployments/{dep_id}/replicas", data={"replicas": "2", "csrf_token": owner.csrf}
    )
    page = owner.get(f"/console/deployments/{dep_id}")
    assert page.status_code == 200, page.text[-500:]
    assert "deployment.create" in page.text and "details@example.com" in page.text
    assert "Cold-start wait" in page.text and 'hx-get="/console/deployments/' in page.text
    assert "<dt>Tool-call format</dt><dd>from the chat template</dd>" in page.text
    live = owner.get(f"/console/deployments/{dep_id}/replicas-now")  # what htmx polls
    assert live.status_code == 200 and "Live state unavailable" in live.text  # no gateway here
    history = owner.get(f"/console/api/deployments/{dep_id}/load").json()  # the load chart's
    assert {"t", "kv_pct", "waiting", "running", "resident"} <= set(history["series"])
    assert history["series"]["t"] == []  # no gateway, no samples

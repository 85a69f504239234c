"""Console pages over a real control plane: tenants (create, limits, suspend, delete, keys
shown once, revoke, CSV), escaping of what tenants supply, adapters across tenants with
delete, jobs, base models from an S3 prefix, deployments, and the chart data as JSON."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from support.console import make_operator, page_csrf, sign_in
from support.uploads import (
    adapter_files,
    service_uploader,
    upload,
    upload_through_service,
    wait_for_version,
)

from loraplex.platform.db.models import AdapterVersion, Tenant, UsageRecord
from loraplex.platform.db.session import make_sessionmaker, session_scope

XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def owner(console_app: Any, console_settings: Any):
    from fastapi.testclient import TestClient

    make_operator(console_settings.database_url, "owner@example.com", "owner")
    c = TestClient(console_app, raise_server_exceptions=False)  # no lifespan: no gateway needed
    assert sign_in(c, "owner@example.com").status_code == 303
    c.csrf = page_csrf(c)  # type: ignore[attr-defined]
    yield c
    c.close()


def _create_tenant(owner: Any, name: str, **limits: str) -> str:
    r = owner.post("/console/tenants", data={"name": name, "csrf_token": owner.csrf, **limits},
                   follow_redirects=False)  # fmt: skip
    assert r.status_code == 303, r.text
    return r.headers["location"].split("/")[3].split("?")[0]


def _issue_key(owner: Any, tid: str) -> str:
    r = owner.post(f"/console/tenants/{tid}/keys", data={"name": "k", "csrf_token": owner.csrf})
    assert r.status_code == 201, r.text
    start = r.text.index('id="new-key-secret"')
    return r.text[r.text.index(">", start) + 1 : r.text.index("</output>", start)]


def test_every_page_renders(owner: Any) -> None:
    for path in ("/console/", "/console/tenants", "/console/adapters", "/console/deployments",
                 "/console/jobs", "/console/audit"):  # fmt: skip
        r = owner.get(path)
        assert r.status_code == 200, (path, r.text[:500])
        assert "script-src 'self'" in r.headers["content-security-policy"]


def test_tenant_lifecycle_key_once_revoke_suspend_delete(owner: Any, console_settings: Any) -> None:
    name = f"acme-{uuid.uuid4().hex[:6]}"
    tid = _create_tenant(owner, name, requests_per_minute="77")
    listing = owner.get("/console/tenants", params={"q": name[:7]})
    assert name in listing.text and "77" in listing.text
    plain = _issue_key(owner, tid)
    assert plain.startswith("lp_")
    assert plain not in owner.get(f"/console/tenants/{tid}").text  # shown once only
    auth = {"Authorization": f"Bearer {plain}"}
    assert owner.get("/v1/adapters", headers=auth).status_code == 200
    # Suspend: every key refused with a clear error; resume: back.
    owner.post(
        f"/console/tenants/{tid}/suspend", data={"action": "suspend", "csrf_token": owner.csrf}
    )
    r = owner.get("/v1/adapters", headers=auth)
    assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_suspended"
    assert "suspended" in owner.get(f"/console/tenants/{tid}").text
    owner.post(
        f"/console/tenants/{tid}/suspend", data={"action": "resume", "csrf_token": owner.csrf}
    )
    assert owner.get("/v1/adapters", headers=auth).status_code == 200
    # Limits edit.
    owner.post(f"/console/tenants/{tid}/limits", data={"requests_per_minute": "", "tokens_per_minute": "5000",
               "monthly_token_quota": "", "csrf_token": owner.csrf})  # fmt: skip
    with make_sessionmaker(console_settings.database_url)() as s:
        t = s.get(Tenant, uuid.UUID(tid))
        assert (t.requests_per_minute, t.tokens_per_minute) == (None, 5000)
    # Revoke: the key is refused.
    with make_sessionmaker(console_settings.database_url)() as s:
        from loraplex.platform.db.models import ApiKey

        key_id = s.scalars(select(ApiKey.id).where(ApiKey.tenant_id == uuid.UUID(tid))).one()
    owner.post(f"/console/tenants/{tid}/keys/{key_id}/revoke", data={"csrf_token": owner.csrf})
    assert owner.get("/v1/adapters", headers=auth).status_code == 401
    # CSV export and delete.
    csv = owner.get(f"/console/tenants/{tid}/usage.csv")
    assert csv.status_code == 200 and csv.text.startswith("day,model,requests")
    r = owner.post(f"/console/tenants/{tid}/delete", data={"csrf_token": owner.csrf})
    assert r.status_code == 200 and f"Deleted {name}" in r.text
    with make_sessionmaker(console_settings.database_url)() as s:
        assert s.get(Tenant, uuid.UUID(tid)) is None


def test_tenant_supplied_text_is_escaped(owner: Any) -> None:
    tid = _create_tenant(owner, XSS)
    for path in ("/console/tenants", f"/console/tenants/{tid}", "/console/audit"):
        html = owner.get(path).text
        assert XSS not in html, path
        assert "&lt;img src=x onerror=alert(1)&gt;" in html, path


def test_bad_input_shows_the_message(owner: Any) -> None:
    r = owner.post("/console/tenants", data={"name": "x", "requests_per_minute": "lots",
                   "csrf_token": owner.csrf})  # fmt: skip
    assert r.status_code == 400 and "whole number" in r.text
    assert owner.get("/console/tenants/not-a-uuid").status_code == 404


def test_usage_series_json_counts_rows(owner: Any, console_settings: Any) -> None:
    tid = _create_tenant(owner, f"use-{uuid.uuid4().hex[:6]}")
    before = owner.get("/console/api/usage-series", params={"window": "hour"}).json()
    now = datetime.now(UTC)
    with session_scope(make_sessionmaker(console_settings.database_url)) as s:
        for i in range(5):
            s.add(UsageRecord(tenant_id=uuid.UUID(tid), model="m", prompt_tokens=3,
                              completion_tokens=60, ttft_ms=100 + i, itl_ms=7.5,
                              failed=(i == 0), created_at=now - timedelta(seconds=5)))  # fmt: skip
    after = owner.get("/console/api/usage-series", params={"window": "hour"}).json()
    s0, s1 = before["series"], after["series"]
    assert len(s1["t"]) == 60 and sum(s1["requests"]) == sum(s0["requests"]) + 5
    assert sum(s1["tok_s"]) == pytest.approx(sum(s0["tok_s"]) + 5, abs=0.01)
    assert max(e for e in s1["error_pct"]) > 0
    assert any(v is not None and v >= 100 for v in s1["ttft_p95"])
    tenant_page = owner.get(f"/console/tenants/{tid}").text  # its chart: 5 requests to "m"
    days = "0, " * 29 + "5"  # the last 30 days, today last
    assert "{&#34;label&#34;: &#34;m&#34;, &#34;values&#34;: [" + days + "]}" in tenant_page
    day = owner.get("/console/api/usage-series", params={"window": "day"}).json()
    assert len(day["series"]["t"]) == 1440 and sum(day["series"]["requests"]) >= 5


def test_base_model_from_prefix_and_deployment(
    owner: Any, base_model: str, console_settings
) -> None:
    r = owner.post("/console/base-models", data={"name": "tiny-again",
                   "object_prefix": f"models/{base_model}/", "csrf_token": owner.csrf})  # fmt: skip
    assert r.status_code == 200 and "Registered tiny-again" in r.text
    bad = owner.post("/console/base-models", data={"name": "nope", "object_prefix": "tenants/x/",
                     "csrf_token": owner.csrf})  # fmt: skip
    assert bad.status_code == 400
    empty = owner.post("/console/base-models", data={"name": "nope", "object_prefix": "models/none/",
                       "csrf_token": owner.csrf})  # fmt: skip
    assert empty.status_code == 400 and "config.json" in empty.text
    r = owner.post("/console/deployments", data={"name": "dep-console", "base_model": "tiny-again",
                   "weights": "fp32", "kv_cache": "auto", "max_loras": "2", "max_lora_rank": "8",
                   "replicas": "2", "csrf_token": owner.csrf})  # fmt: skip
    assert r.status_code == 200 and "dep-console" in r.text
    # The same through the admin API.
    admin = {"Authorization": f"Bearer {console_settings.admin_key}"}
    r = owner.post("/admin/v1/base-models", headers=admin,
                   json={"name": "tiny-api", "object_prefix": f"models/{base_model}"})  # fmt: skip
    assert r.status_code == 201 and r.json()["object_prefix"] == f"models/{base_model}/"


def test_adapters_across_tenants_and_delete_version(
    owner: Any, worker: Any, deployment, base_model: str, adapter_r4, adapter_r16, console_settings
) -> None:
    tid = _create_tenant(owner, f"ad-{uuid.uuid4().hex[:6]}")
    key = _issue_key(owner, tid)
    auth = {"Authorization": f"Bearer {key}"}
    cfg, w = adapter_files(adapter_r4)
    assert upload(owner, auth, "good", base_model, cfg, w).status_code in (200, 201, 202)
    cfg16, w16 = adapter_files(adapter_r16)
    assert upload(owner, auth, "toobig", base_model, cfg16, w16).status_code in (200, 201, 202)
    assert wait_for_version(owner, auth, "good", 1)["status"] == "ready"
    failed = wait_for_version(owner, auth, "toobig", 1)
    assert failed["status"] == "failed"
    page = owner.get("/console/adapters", params={"status": "failed"}).text
    assert "toobig" in page and "good" not in page.split("<tbody>")[1]
    assert failed["error"][:30].replace("'", "&#39;") in page
    ready = owner.get("/console/adapters", params={"status": "ready", "tenant": "ad-"}).text
    assert "good" in ready and "q_proj" in ready
    # A validation whose job gave up on an infrastructure error (the version still
    # validating, its files stored) runs again from the Jobs page.
    from loraplex.platform.db.models import Job
    from loraplex.platform.jobs.validate import mark_transient_failure

    up = service_uploader(console_settings, uuid.UUID(tid), queue="nobody-reads-this")
    stuck = upload_through_service(up, "stuck", base_model, adapter_r4)
    with make_sessionmaker(console_settings.database_url)() as s:
        job_id = s.scalars(select(Job.id).where(Job.subject_id == stuck.id)).one()
    mark_transient_failure(console_settings, job_id, "object storage timed out", final=True)
    jobs = owner.get("/console/jobs", params={"status": "failed"}).text.split("<tbody>")[1]
    assert "object storage timed out" in jobs and f"/console/jobs/{job_id}/retry" in jobs
    r = owner.post(f"/console/jobs/{job_id}/retry", data={"csrf_token": owner.csrf})
    assert r.status_code == 200 and "Validation queued again" in r.text, r.text[-800:]
    assert wait_for_version(owner, auth, "stuck", 1)["status"] == "ready"
    again = owner.post(f"/console/jobs/{job_id}/retry", data={"csrf_token": owner.csrf})
    assert again.status_code == 409  # the version is validated now
    with make_sessionmaker(console_settings.database_url)() as s:
        vid = s.scalars(
            select(AdapterVersion.id).where(AdapterVersion.tenant_id == uuid.UUID(tid),
                                            AdapterVersion.status == "ready",
                                            AdapterVersion.id != stuck.id)
        ).one()  # fmt: skip
    r = owner.post(f"/console/adapters/versions/{vid}/delete", data={"csrf_token": owner.csrf})
    assert r.status_code == 200 and "Version deleted" in r.text
    assert owner.get("/v1/adapters/good", headers=auth).status_code == 404
    # A tenant with adapters cannot be deleted (their objects would lose their rows).
    r = owner.post(f"/console/tenants/{tid}/delete", data={"csrf_token": owner.csrf})
    assert r.status_code == 409


def test_change_replicas(owner: Any, console_settings: Any, base_model: str) -> None:
    """Through `deployments.set_replicas` (the admin PATCH route's service, from the operator
    CLI's branch): 501 with a clear message until that is merged, then the count changes."""
    from loraplex.platform.db.models import Deployment
    from loraplex.platform.services import deployments

    r = owner.post("/console/deployments", data={"name": "dep-scale", "base_model": base_model,
                   "weights": "fp32", "kv_cache": "auto", "replicas": "1", "csrf_token": owner.csrf})  # fmt: skip
    assert r.status_code == 200, r.text
    with make_sessionmaker(console_settings.database_url)() as s:
        dep_id = s.scalars(select(Deployment.id).where(Deployment.name == "dep-scale")).one()
    r = owner.post(f"/console/deployments/{dep_id}/replicas",
                   data={"replicas": "3", "csrf_token": owner.csrf})  # fmt: skip
    if not hasattr(deployments, "set_replicas"):
        assert r.status_code == 501 and "set_replicas" in r.text
        return
    assert r.status_code == 200 and "dep-scale: 3 replica(s)" in r.text
    with make_sessionmaker(console_settings.database_url)() as s:
        assert s.get(Deployment, dep_id).replicas == 3
    bad = owner.post(f"/console/deployments/{dep_id}/replicas",
                     data={"replicas": "-1", "csrf_token": owner.csrf})  # fmt: skip
    assert bad.status_code == 400

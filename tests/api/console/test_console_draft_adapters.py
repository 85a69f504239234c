"""Draft adapters on the console's adapter page (issue 25): each version's draft adapters with
the deployments that draft with them, the draft model, status, size, created and a failed
one's reason code; an owner deletes one (objects, then row, audited), a viewer sees no action
and is refused; another adapter's (another tenant's) draft adapter is not found through this
adapter's page, and a busy one is refused with its code."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from support.console import make_operator, page_csrf, sign_in
from support.gateway_catalog import add_adapter_version

from loraplex.platform.db.models import (
    AdapterVersion,
    AuditLog,
    BaseModel,
    Deployment,
    DraftAdapter,
)
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.object_keys import draft_adapter_prefix
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.services.draft_adapters import DRAFT_JOB
from loraplex.platform.services.tenants import create_tenant

DRAFT_MODEL = "s3://models-bucket/draft-tiny"


def _client(console_app: Any, url: str, email: str, role: str) -> TestClient:
    make_operator(url, email, role)
    c = TestClient(console_app, raise_server_exceptions=False)
    assert sign_in(c, email).status_code == 303
    c.csrf = page_csrf(c)  # type: ignore[attr-defined]
    return c


@pytest.fixture(scope="module")
def owner(console_app: Any, console_settings: Any):
    c = _client(console_app, console_settings.database_url, "drafts-owner@example.com", "owner")
    yield c
    c.close()


@pytest.fixture(scope="module")
def viewer(console_app: Any, console_settings: Any):
    c = _client(console_app, console_settings.database_url, "drafts-viewer@example.com", "viewer")
    yield c
    c.close()


@pytest.fixture(scope="module")
def drafting(console_settings: Any, base_model: str) -> str:
    """A deployment of the base model drafting with DRAFT_MODEL (draft adapters on)."""
    with session_scope(make_sessionmaker(console_settings.database_url)) as s:
        base = s.scalars(select(BaseModel).where(BaseModel.name == base_model)).one()
        s.add(Deployment(
            id=uuid.uuid4(), name="dep-drafting", base_model_id=base.id,
            weight_quantization="fp32", kv_cache_dtype="auto", max_loras=4, max_lora_rank=8,
            replicas=1, expert_parallel_size=1,
            speculative={"method": "draft_adapter", "draft_model": DRAFT_MODEL, "k_min": 1,
                         "k_max": 4},
        ))  # fmt: skip
    return "dep-drafting"


def _draft(s: Any, version: AdapterVersion, status: str, *, model: str = DRAFT_MODEL,
           nbytes: int | None = None, error: str | None = None) -> DraftAdapter:  # fmt: skip
    draft_id = uuid.uuid4()
    row = DraftAdapter(
        id=draft_id, tenant_id=version.tenant_id, adapter_version_id=version.id,
        draft_model=model, object_prefix=draft_adapter_prefix(version.object_prefix, draft_id),
        status=status, bytes=nbytes, error=error,
    )  # fmt: skip
    s.add(row)
    s.flush()
    return row


def _setup(console_settings: Any, base_model: str) -> dict[str, Any]:
    """Tenant A's adapter (v1 with a ready and a failed draft adapter, v2 with a validating
    one) and tenant B's adapter with a ready draft adapter; the ready ones' objects stored."""
    factory = make_sessionmaker(console_settings.database_url)
    out: dict[str, Any] = {}
    with session_scope(factory) as s:
        ta = create_tenant(s, f"drafts-a-{uuid.uuid4().hex[:6]}").id
        tb = create_tenant(s, f"drafts-b-{uuid.uuid4().hex[:6]}").id
        adapter, v1 = add_adapter_version(s, ta, base_model, "drafted")
        _, v2 = add_adapter_version(s, ta, base_model, "drafted")
        ready = _draft(s, v1, "ready", nbytes=3 * 1024 * 1024)
        failed = _draft(s, v1, "failed", model="/srv/other-draft", error="tensor shapes differ")
        records.create_job(
            s, records.VALIDATE, tenant_id=ta, subject_id=failed.id, payload={"subject": DRAFT_JOB}
        )  # an older attempt: no code
        job = records.create_job(s, records.VALIDATE, tenant_id=ta, subject_id=failed.id,
                                 payload={"subject": DRAFT_JOB})  # fmt: skip
        records.finish(s, job, ok=True, outcome={"outcome": "failed", "code": "shape_mismatch"})
        busy = _draft(s, v2, "validating")
        other_adapter, bv = add_adapter_version(s, tb, base_model, "drafted")
        other = _draft(s, bv, "ready", nbytes=100)
        out.update(aid=adapter.id, v1=v1.n, ready=ready, failed=failed, busy=busy,
                   other=other, other_aid=other_adapter.id)  # fmt: skip
    client = objects.s3_client(console_settings)
    for row in (out["ready"], out["other"]):
        for key in (row.config_key, row.weights_key):
            objects.put_bytes(client, console_settings.s3_bucket, key, b"x")
    return out


def _row(console_settings: Any, draft_id: uuid.UUID) -> DraftAdapter | None:
    with make_sessionmaker(console_settings.database_url)() as s:
        return s.get(DraftAdapter, draft_id)


def _keys(console_settings: Any, prefix: str) -> list[str]:
    client = objects.s3_client(console_settings)
    return objects.list_keys(client, console_settings.s3_bucket, prefix)


def _delete(c: TestClient, aid: Any, draft_id: Any) -> Any:
    return c.post(f"/console/adapters/{aid}/drafts/{draft_id}/delete",
                  data={"csrf_token": c.csrf}, follow_redirects=False)  # type: ignore[attr-defined]  # fmt: skip


def test_the_adapter_page_lists_each_versions_draft_adapters(
    owner: TestClient, viewer: TestClient, console_settings: Any, base_model: str, drafting: str
) -> None:
    got = _setup(console_settings, base_model)
    page = owner.get(f"/console/adapters/{got['aid']}")
    assert page.status_code == 200, page.text[-500:]
    text = page.text
    assert "Draft adapters" in text
    ready, failed, busy = got["ready"], got["failed"], got["busy"]
    for shown in (str(ready.id), str(failed.id), str(busy.id), DRAFT_MODEL, "/srv/other-draft",
                  "dep-drafting", "3.0 MiB", "shape_mismatch", "tensor shapes differ",
                  "validating"):  # fmt: skip
        assert shown in text, shown
    # No deployment drafts with the failed one's model now: said so, not left blank.
    assert "no deployment drafts with it now" in text
    # Another tenant's draft adapter is not on this adapter's page.
    assert str(got["other"].id) not in text
    # The owner may delete the ready and the failed one, not the one still validating.
    action = f"/console/adapters/{got['aid']}/drafts/{{}}/delete"
    assert action.format(ready.id) in text and action.format(failed.id) in text
    assert action.format(busy.id) not in text
    # A viewer sees them, with no delete action.
    seen = viewer.get(f"/console/adapters/{got['aid']}").text
    assert str(ready.id) in seen and action.format(ready.id) not in seen


def test_an_owner_deletes_a_draft_adapter_a_viewer_cannot(
    owner: TestClient, viewer: TestClient, console_settings: Any, base_model: str, drafting: str
) -> None:
    got = _setup(console_settings, base_model)
    ready = got["ready"]
    refused = _delete(viewer, got["aid"], ready.id)
    assert refused.status_code == 403 and "read_only_role" in refused.text
    assert _row(console_settings, ready.id) is not None

    done = _delete(owner, got["aid"], ready.id)
    assert done.status_code == 303, done.text[-500:]
    assert done.headers["location"].startswith(f"/console/adapters/{got['aid']}?msg=")
    assert _row(console_settings, ready.id) is None
    assert _keys(console_settings, ready.object_prefix) == []
    with make_sessionmaker(console_settings.database_url)() as s:
        audited = s.scalar(
            select(func.count()).select_from(AuditLog).where(
                AuditLog.action == "draft_adapter.delete", AuditLog.resource_id == str(ready.id)
            )
        )  # fmt: skip
    assert audited == 1
    page = owner.get(done.headers["location"])
    assert "Draft adapter deleted." in page.text and str(ready.id) not in page.text


def test_a_draft_adapter_is_found_only_through_its_own_adapter(
    owner: TestClient, console_settings: Any, base_model: str, drafting: str
) -> None:
    got = _setup(console_settings, base_model)
    other = got["other"]
    # Tenant B's draft adapter through tenant A's adapter: not found, untouched.
    wrong = _delete(owner, got["aid"], other.id)
    assert wrong.status_code == 404 and "draft_adapter_not_found" in wrong.text
    row = _row(console_settings, other.id)
    assert row is not None and row.status == "ready"
    assert _keys(console_settings, other.object_prefix)
    for bad in (uuid.uuid4(), "not-a-uuid"):
        resp = _delete(owner, got["aid"], bad)
        assert resp.status_code == 404 and "draft_adapter_not_found" in resp.text, resp.text
    assert _delete(owner, "not-a-uuid", other.id).status_code == 404
    # One still validating: refused with its code, left as it was.
    busy = _delete(owner, got["aid"], got["busy"].id)
    assert busy.status_code == 409 and "draft_adapter_busy" in busy.text
    row = _row(console_settings, got["busy"].id)
    assert row is not None and row.status == "validating"


def test_storage_down_answers_503_and_leaves_the_draft_adapter_to_the_reconciler(
    owner: TestClient, console_settings: Any, base_model: str, drafting: str
) -> None:
    from loraplex.api.app import create_app
    from loraplex.platform.jobs.reconcile import reconcile_objects

    got = _setup(console_settings, base_model)
    ready = got["ready"]
    broken = console_settings.model_copy(update={"s3_endpoint_url": "http://127.0.0.1:9"})
    c = TestClient(create_app(broken), raise_server_exceptions=False)  # no lifespan: no gateway
    assert sign_in(c, "drafts-owner@example.com").status_code == 303
    c.csrf = page_csrf(c)  # type: ignore[attr-defined]
    resp = _delete(c, got["aid"], ready.id)
    c.close()
    assert resp.status_code == 503 and "storage_unavailable" in resp.text, resp.text[-500:]
    row = _row(console_settings, ready.id)
    assert row is not None and row.status == "deleting"
    assert _keys(console_settings, ready.object_prefix)
    assert ready.id in reconcile_objects(console_settings).deleted_drafts
    assert _row(console_settings, ready.id) is None
    assert _keys(console_settings, ready.object_prefix) == []

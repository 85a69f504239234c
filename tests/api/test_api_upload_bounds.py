"""Upload bounds per tenant: presigned parts sign their Content-Length, concurrent uploads and
stored adapter bytes are capped (own limit or the Settings default, shown on /v1/limits), and
a deletion whose object removal fails keeps its rows `deleting` until the reconciler succeeds."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from support.uploads import adapter_files, upload, wait_for_version

from loraplex.platform.db.models import Adapter, AdapterVersion
from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.services import objects


def _start(client: TestClient, headers: dict, name: str, base_model: str, config: bytes,
           size: int):  # fmt: skip
    return client.post(
        f"/v1/adapters/{name}/uploads",
        headers=headers,
        json={"base_model": base_model, "adapter_config": json.loads(config), "size": size},
    )


def test_a_presigned_part_takes_exactly_its_signed_size(
    client: TestClient, base_model: str, make_tenant, adapter_r4: Path
) -> None:
    _, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    plan = _start(client, headers, "sized", base_model, config, len(weights)).json()
    (part,) = plan["parts"]
    assert part["size"] == len(weights)
    # More bytes than declared: the store's signature check refuses the PUT.
    bigger = httpx.put(part["url"], content=weights + b"\0" * 4096, timeout=30)
    assert bigger.status_code == 403, bigger.text
    assert httpx.put(part["url"], content=weights, timeout=30).status_code == 200


def test_concurrent_upload_limit_per_tenant_on_v1_limits(
    client: TestClient, admin_headers: dict, base_model: str, make_tenant, adapter_r4: Path
) -> None:
    tenant_id, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    patched = client.patch(
        f"/admin/v1/tenants/{tenant_id}", headers=admin_headers, json={"max_concurrent_uploads": 1}
    )
    assert patched.status_code == 200 and patched.json()["limits"]["max_concurrent_uploads"] == 1
    assert _start(client, headers, "one", base_model, config, len(weights)).status_code == 201
    refused = _start(client, headers, "two", base_model, config, len(weights))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_uploads"
    limits = client.get("/v1/limits", headers=headers).json()
    assert limits["concurrent_uploads"] == {"limit": 1, "in_progress": 1, "remaining": 0}
    assert limits["stored_adapter_bytes"]["used"] == len(weights)
    # nothing half-written: the refused name does not exist
    assert client.get("/v1/adapters/two", headers=headers).status_code == 404


def test_stored_bytes_limit_per_tenant(
    client: TestClient,
    worker,
    admin_headers: dict,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
) -> None:
    tenant_id, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    cap = len(weights) * 3 // 2
    client.patch(
        f"/admin/v1/tenants/{tenant_id}", headers=admin_headers,
        json={"max_stored_adapter_bytes": cap},
    )  # fmt: skip
    assert upload(client, headers, "first", base_model, config, weights).status_code == 202
    assert wait_for_version(client, headers, "first", 1)["status"] == "ready"
    refused = upload(client, headers, "second", base_model, config, weights)
    assert (
        refused.status_code == 429 and refused.json()["error"]["code"] == "storage_limit_exceeded"
    )
    limits = client.get("/v1/limits", headers=headers).json()["stored_adapter_bytes"]
    assert limits == {"limit": cap, "used": len(weights), "remaining": cap - len(weights)}


def test_a_failed_object_delete_keeps_rows_deleting_until_the_reconciler(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    from loraplex.platform.jobs.delete import run_delete
    from loraplex.platform.jobs.reconcile import reconcile_objects
    from loraplex.platform.services import adapters as svc

    tenant_id, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    assert upload(client, headers, "sticky", base_model, config, weights).status_code == 202
    wait_for_version(client, headers, "sticky", 1)
    factory = make_sessionmaker(cp_settings.database_url)
    up = svc.Uploader(cp_settings, factory, _Nowhere(), uuid.UUID(tenant_id), "test")
    adapter, job_id = svc.delete_adapter(up, "sticky")
    assert client.get("/v1/adapters/sticky", headers=headers).status_code == 404
    # Object storage is down for the deletion job: its rows must stay, marked deleting.
    broken = cp_settings.model_copy(update={"s3_endpoint_url": "http://127.0.0.1:9"})
    with pytest.raises(Exception, match="Could not connect|Connect"):
        run_delete(broken, job_id)  # the job fails; Celery, then recovery, retry it
    with factory() as s:
        row = s.get(Adapter, adapter.id)
        assert row is not None and row.deleted_at is not None
        statuses = s.scalars(
            select(AdapterVersion.status).where(AdapterVersion.adapter_id == adapter.id)
        ).all()
    assert statuses == ["deleting"]
    prefix = svc.adapter_prefix(uuid.UUID(tenant_id), adapter.id)
    assert objects.list_keys(s3_client, cp_settings.s3_bucket, prefix)
    # The name is free again at once.
    assert upload(client, headers, "sticky", base_model, config, weights).json()["version"] == 1
    report = reconcile_objects(cp_settings)
    assert adapter.id in report.deleted_adapters
    assert objects.list_keys(s3_client, cp_settings.s3_bucket, prefix) == []
    with factory() as s:
        assert s.get(Adapter, adapter.id) is None


def test_reconciler_removes_objects_without_rows_after_grace(
    client: TestClient, cp_settings, s3_client
) -> None:
    from loraplex.platform.jobs.reconcile import reconcile_objects

    orphan = f"tenants/{uuid.uuid4()}/adapters/{uuid.uuid4()}/v1/adapter_model.safetensors"
    objects.put_bytes(s3_client, cp_settings.s3_bucket, orphan, b"left behind")
    assert orphan not in reconcile_objects(cp_settings).orphan_keys  # within the grace period
    assert objects.object_size(s3_client, cp_settings.s3_bucket, orphan) is not None
    assert orphan in reconcile_objects(cp_settings, grace_s=0).orphan_keys
    assert objects.object_size(s3_client, cp_settings.s3_bucket, orphan) is None


class _Nowhere:
    def send(self, kind: str, job_id: uuid.UUID) -> None:
        pass

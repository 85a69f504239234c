"""`PATCH /admin/v1/deployments/{id}`: scaling a deployment's replica count, against real
PostgreSQL."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy import select


def _scale(client: TestClient, headers: dict, dep_id: str, body: object):
    return client.patch(f"/admin/v1/deployments/{dep_id}", headers=headers, json=body)


def _audit_rows(cp_settings, dep_id: str) -> list[tuple[str, str, dict]]:
    from loraplex.platform.db.models import AuditLog
    from loraplex.platform.db.session import make_sessionmaker

    with make_sessionmaker(cp_settings.database_url)() as s:
        rows = s.execute(
            select(AuditLog.action, AuditLog.actor, AuditLog.detail)
            .where(AuditLog.resource_id == dep_id)
            .order_by(AuditLog.id)
        ).all()
    return [tuple(r) for r in rows]


def test_scale_changes_replicas_and_is_audited(
    client: TestClient, admin_headers: dict, deployment: dict, cp_settings
) -> None:
    dep_id = deployment["id"]
    resp = _scale(client, admin_headers, dep_id, {"replicas": 3})
    assert resp.status_code == 200, resp.text
    assert resp.json()["replicas"] == 3 and resp.json()["id"] == dep_id
    listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
    assert {d["id"]: d["replicas"] for d in listed}[dep_id] == 3
    assert _scale(client, admin_headers, dep_id, {"replicas": 0}).json()["replicas"] == 0
    scales = [r for r in _audit_rows(cp_settings, dep_id) if r[0] == "deployment.scale"]
    assert [r[2]["replicas"] for r in scales] == [3, 0]
    assert scales[0][2]["replicas_before"] == deployment["replicas"]


def test_scale_errors_are_openai_shaped(
    client: TestClient, admin_headers: dict, deployment: dict
) -> None:
    dep_id = deployment["id"]
    before = _scale(client, admin_headers, dep_id, {"replicas": 2}).json()["replicas"]
    for bad in (-1, 5000):
        resp = _scale(client, admin_headers, dep_id, {"replicas": bad})
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == "replicas" and err["code"] == "invalid_value"
        assert str(bad) in err["message"]
    assert _scale(client, admin_headers, dep_id, {"replicas": "2"}).status_code == 422
    assert _scale(client, admin_headers, dep_id, {"replicas": 1, "x": 1}).status_code == 422
    listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
    assert {d["id"]: d["replicas"] for d in listed}[dep_id] == before  # nothing half-written
    for unknown in (str(uuid.uuid4()), "not-a-uuid"):
        resp = _scale(client, admin_headers, unknown, {"replicas": 1})
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "deployment_not_found"
    assert client.patch(f"/admin/v1/deployments/{dep_id}", json={"replicas": 1}).status_code == 401

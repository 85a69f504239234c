"""The orphan reconciler: no object without a row, no row left half-deleted.

One pass (the worker runs it periodically, `Settings.orphan_grace_s` apart at most):
1. draft adapters and versions in `deleting` and adapters with `deleted_at` (their deletion
   met a storage failure): remove their objects, then their rows;
2. `failed` versions and draft adapters still holding objects (their clean-up met a storage
   failure): remove them (the rows stay, with their reason);
3. objects under `tenants/` that no row points to, older than the grace period (an upload
   writes its row before its objects, so younger ones may be in flight): remove them. A key in
   a version's `draft/{id}/` folder belongs to that draft adapter's row, any other key in the
   version's folder to the version's row; so a live draft adapter's objects are never orphans,
   and a draft folder whose row is gone is one even while its version lives.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select

from loraplex.platform.db.models import Adapter, AdapterVersion, DraftAdapter
from loraplex.platform.db.session import session_scope
from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.object_keys import (
    TENANTS_ROOT,
    adapter_prefix,
    draft_prefix_of,
    version_prefix_of,
)
from loraplex.platform.services import objects
from loraplex.platform.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    """What one pass removed."""

    deleted_versions: list[uuid.UUID] = field(default_factory=list)
    deleted_adapters: list[uuid.UUID] = field(default_factory=list)
    cleaned_failed: list[uuid.UUID] = field(default_factory=list)
    deleted_drafts: list[uuid.UUID] = field(default_factory=list)
    cleaned_failed_drafts: list[uuid.UUID] = field(default_factory=list)
    orphan_keys: list[str] = field(default_factory=list)


def _remove(client: Any, settings: Settings, prefix: str) -> bool:
    try:
        objects.delete_prefix(client, settings.s3_bucket, prefix)
    except Exception:  # noqa: BLE001 - storage still failing: the next pass retries
        log.warning("reconciler: could not remove %s yet", prefix, exc_info=True)
        return False
    return True


def _finish_deletions(settings: Settings, client: Any, report: ReconcileReport) -> None:
    factory = job_sessions(settings)
    with session_scope(factory) as session:
        drafts = session.execute(
            select(DraftAdapter.id, DraftAdapter.object_prefix).where(
                DraftAdapter.status == "deleting"
            )
        ).all()
        versions = session.execute(
            select(AdapterVersion.id, AdapterVersion.adapter_id, AdapterVersion.object_prefix)
            .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
            .where(AdapterVersion.status == "deleting", Adapter.deleted_at.is_(None))
        ).all()
        adapters = session.execute(
            select(Adapter.id, Adapter.tenant_id).where(Adapter.deleted_at.is_not(None))
        ).all()
    for draft_id, prefix in drafts:
        if _remove(client, settings, prefix):
            with session_scope(factory) as session:
                session.execute(
                    delete(DraftAdapter).where(
                        DraftAdapter.id == draft_id, DraftAdapter.status == "deleting"
                    )
                )
            report.deleted_drafts.append(draft_id)
    for version_id, adapter_id, prefix in versions:
        if _remove(client, settings, prefix):
            from loraplex.platform.services.adapters import drop_version_row

            with session_scope(factory) as session:
                drop_version_row(session, version_id, adapter_id)
            report.deleted_versions.append(version_id)
    for adapter_id, tenant_id in adapters:
        if _remove(client, settings, adapter_prefix(tenant_id, adapter_id)):
            with session_scope(factory) as session:
                session.execute(delete(Adapter).where(Adapter.id == adapter_id))
            report.deleted_adapters.append(adapter_id)


def reconcile_objects(settings: Settings, grace_s: float | None = None) -> ReconcileReport:
    """One reconciler pass (see the module docstring); returns what it removed."""
    grace = settings.orphan_grace_s if grace_s is None else grace_s
    report = ReconcileReport()
    client = objects.s3_client(settings)
    _finish_deletions(settings, client, report)
    with session_scope(job_sessions(settings)) as session:
        known = set(session.scalars(select(AdapterVersion.object_prefix)))
        known |= set(session.scalars(select(DraftAdapter.object_prefix)))
        failed = session.execute(
            select(AdapterVersion.id, AdapterVersion.object_prefix).where(
                AdapterVersion.status == "failed"
            )
        ).all()
        failed_drafts = session.execute(
            select(DraftAdapter.id, DraftAdapter.object_prefix).where(
                DraftAdapter.status == "failed"
            )
        ).all()
    cutoff = datetime.now(UTC) - timedelta(seconds=grace)
    holders: set[str] = set()  # every version and draft folder holding some object
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=settings.s3_bucket, Prefix=TENANTS_ROOT):
        for obj in page.get("Contents", []) or []:
            version = version_prefix_of(obj["Key"])
            if version is None:
                continue
            draft = draft_prefix_of(obj["Key"])
            holders.add(version)
            if draft is not None:
                holders.add(draft)
            owner = draft or version
            if owner not in known and obj["LastModified"] < cutoff:
                report.orphan_keys.append(obj["Key"])
    for version_id, prefix in failed:
        if prefix in holders and _remove(client, settings, prefix):
            report.cleaned_failed.append(version_id)
    for draft_id, prefix in failed_drafts:
        if prefix in holders and _remove(client, settings, prefix):
            report.cleaned_failed_drafts.append(draft_id)
    for i in range(0, len(report.orphan_keys), objects.DELETE_BATCH):
        batch = [{"Key": k} for k in report.orphan_keys[i : i + objects.DELETE_BATCH]]
        client.delete_objects(Bucket=settings.s3_bucket, Delete={"Objects": batch, "Quiet": True})
    if any((report.deleted_versions, report.deleted_adapters, report.cleaned_failed,
            report.deleted_drafts, report.cleaned_failed_drafts, report.orphan_keys)):  # fmt: skip
        log.warning("reconciler: %s", report)
    return report

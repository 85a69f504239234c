"""The console's detail pages' reads: one adapter (its versions with their validation report,
usage per day and its own TTFT percentiles) and one deployment (its row and its audit trail).
Each read is bounded and served by an index (usage by tenant and time, audit by time)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Float, cast, func, select
from sqlalchemy.orm import Session

from loraplex.adapters.identity import adapter_ref_key
from loraplex.platform.db.models import (
    Adapter,
    AdapterVersion,
    AuditLog,
    Deployment,
    Operator,
    Tenant,
    UsageRecord,
)

from .errors import NotFound

USAGE_DAYS = 30
LATENCY_WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class VersionReport:
    """One version and what its validation found."""

    version: AdapterVersion
    key: str | None  # the engine's key for it (what replicas list as resident)

    @property
    def targets(self) -> list[str]:
        """The resolved targets, one line per module: layers, rank, alpha and scale."""
        doc = self.version.targets if isinstance(self.version.targets, dict) else {}
        out = []
        for g in doc.get("groups", []):
            for module, layers in sorted((g.get("layers") or {}).items()):
                out.append(f"{module}: {len(layers)} layers, rank {g.get('rank')}, "
                           f"alpha {g.get('alpha')}, scale {g.get('scale')}")  # fmt: skip
        return out


def adapter_detail(session: Session, adapter_id: uuid.UUID) -> dict[str, Any]:
    """An adapter, its tenant, base model and deployments, every version (newest first), its
    requests and tokens per day (30 days) and TTFT p50/p95 over the last 24 hours."""
    row = session.execute(
        select(Adapter, Tenant).join(Tenant, Tenant.id == Adapter.tenant_id)
        .where(Adapter.id == adapter_id)
    ).first()  # fmt: skip
    if row is None:
        raise NotFound(f"no adapter with id {adapter_id}", code="adapter_not_found")
    adapter, tenant = row
    versions = list(
        session.scalars(
            select(AdapterVersion)
            .where(AdapterVersion.adapter_id == adapter_id)
            .order_by(AdapterVersion.n.desc())
            .limit(200)
        )
    )
    reports = [
        VersionReport(v, adapter_ref_key(v.sha256, v.config_sha256) if v.sha256 else None)
        for v in versions
    ]
    ids = [v.id for v in versions] or [uuid.uuid4()]
    mine = (
        UsageRecord.tenant_id == adapter.tenant_id,
        UsageRecord.adapter_version_id.in_(ids),
    )
    now = datetime.now(UTC)
    since = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(USAGE_DAYS - 1)
    day = func.date_trunc("day", UsageRecord.created_at).label("day")
    usage = session.execute(
        select(day, func.count().label("requests"),
               func.coalesce(func.sum(UsageRecord.prompt_tokens), 0).label("prompt_tokens"),
               func.coalesce(func.sum(UsageRecord.completion_tokens), 0).label("completion_tokens"),
               func.count().filter(UsageRecord.failed).label("errors"))
        .where(*mine, UsageRecord.created_at >= since)
        .group_by(day).order_by(day)
    ).all()  # fmt: skip
    latency = session.execute(
        select(func.count(UsageRecord.ttft_ms).label("n"),
               cast(func.percentile_cont(0.5).within_group(UsageRecord.ttft_ms), Float).label("p50"),
               cast(func.percentile_cont(0.95).within_group(UsageRecord.ttft_ms), Float).label("p95"))
        .where(*mine, UsageRecord.created_at >= now - LATENCY_WINDOW)
    ).one()  # fmt: skip
    deployments = list(
        session.scalars(
            select(Deployment)
            .where(Deployment.base_model_id == adapter.base_model_id)
            .order_by(Deployment.name)
        )
    )
    return {
        "adapter": adapter,
        "tenant": tenant,
        "base": adapter.base_model,
        "versions": reports,
        "deployments": deployments,
        "usage": [r._mapping for r in usage],
        "latency": latency._mapping,
    }


def deployment_detail(session: Session, deployment_id: uuid.UUID) -> dict[str, Any]:
    """A deployment with its base model, and its audit trail (creation, scale and option
    changes, newest first, the last 100)."""
    dep = session.get(Deployment, deployment_id)
    if dep is None:
        raise NotFound(f"no deployment with id {deployment_id}", code="deployment_not_found")
    trail = session.execute(
        select(AuditLog, Operator.email.label("operator"))
        .outerjoin(Operator, Operator.id == AuditLog.operator_id)
        .where(AuditLog.resource_type == "deployment", AuditLog.resource_id == str(dep.id))
        .order_by(AuditLog.created_at.desc(), AuditLog.id.desc())
        .limit(100)
    ).all()
    return {"deployment": dep, "base": dep.base_model, "trail": [r._mapping for r in trail]}

"""The console's detail pages' reads: one adapter (its versions with their validation report and
their draft adapters, usage per day and its own TTFT percentiles) and one deployment (its row
and its audit trail).
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
    DraftAdapter,
    Job,
    Operator,
    Tenant,
    UsageRecord,
)

from . import job_records as records
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


@dataclass(frozen=True)
class DraftView:
    """One draft adapter as the adapter page shows it: the deployments drafting with its draft
    model now (of the adapter's base model, speculating by `draft_adapter`) and, once failed,
    its last validation's reason code."""

    draft: DraftAdapter
    n: int  # its target version's number
    deployments: list[Deployment]
    code: str | None


def _draft_views(
    session: Session, versions: list[AdapterVersion], deployments: list[Deployment]
) -> list[DraftView]:
    """The draft adapters tied to `versions` (newest version first, then oldest draft first),
    with their adapter's tenant only."""
    by_id = {v.id: v for v in versions}
    if not by_id:
        return []
    drafts = list(
        session.scalars(
            select(DraftAdapter)
            .where(DraftAdapter.adapter_version_id.in_(list(by_id)))
            .order_by(DraftAdapter.created_at, DraftAdapter.id)
        )
    )
    drafts = [d for d in drafts if d.tenant_id == by_id[d.adapter_version_id].tenant_id]
    failed = [d.id for d in drafts if d.status == "failed"]
    codes: dict[uuid.UUID, str] = {}
    if failed:
        code = Job.payload["code"].astext
        rows = session.execute(  # a few validation attempts per draft adapter at most
            select(Job.subject_id, code)
            .where(Job.subject_id.in_(failed), Job.kind == records.VALIDATE, code.is_not(None))
            .order_by(Job.created_at.desc(), Job.id)
        ).all()
        for subject, text in rows:  # newest first: the last attempt's code wins
            if subject is not None:
                codes.setdefault(subject, text)

    def drafting(d: DraftAdapter) -> list[Deployment]:
        return [
            dep
            for dep in deployments
            if isinstance(dep.speculative, dict)
            and dep.speculative.get("method") == "draft_adapter"
            and dep.speculative.get("draft_model") == d.draft_model
        ]

    views = [
        DraftView(d, by_id[d.adapter_version_id].n, drafting(d), codes.get(d.id)) for d in drafts
    ]
    return sorted(views, key=lambda view: -view.n)  # stable: oldest draft first per version


def adapter_detail(session: Session, adapter_id: uuid.UUID) -> dict[str, Any]:
    """An adapter, its tenant, base model and deployments, every version (newest first) and
    their draft adapters, its requests and tokens per day (30 days) and TTFT p50/p95 over the
    last 24 hours."""
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
        "drafts": _draft_views(session, versions, deployments),
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

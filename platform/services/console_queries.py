"""The console pages' reads: one query (or a few) per page, each bounded by a page size and
served by an index (migration 0009), so pages stay fast with many tenants and usage rows.
Paged tables sort in the database (`SORTS`: the columns each one sorts by), then page, so a
sort orders the whole result, not the rows of one page."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Float, and_, cast, func, select, text
from sqlalchemy.orm import Session

from loraplex.platform.db.models import (
    Adapter,
    AdapterVersion,
    ApiKey,
    AuditLog,
    BaseModel,
    Deployment,
    Job,
    Operator,
    Tenant,
    UsageRecord,
)

from .console_paging import PAGE_SIZE, Page, Sort, ordered, page_number, parse_sort

WINDOWS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# Inference routes whose refusals (4xx, before admission) count as requests and errors.
INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
_SERIES_SQL = text(
    """
    WITH agg AS (
        SELECT date_trunc('minute', created_at) AS minute,
               count(*) AS n,
               sum(completion_tokens) AS tokens,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms) AS ttft_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms) AS ttft_p95,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY itl_ms) AS itl_p95,
               count(*) FILTER (WHERE failed) AS errors
        FROM usage_records
        WHERE created_at >= :start AND created_at < :end
        GROUP BY 1
    ), refused AS (
        SELECT date_trunc('minute', created_at) AS minute, count(*) AS n
        FROM request_log
        WHERE created_at >= :start AND created_at < :end
          AND status BETWEEN 400 AND 499 AND path = ANY(:paths)
        GROUP BY 1
    ), per AS (
        SELECT g,
               coalesce(agg.n, 0) + coalesce(refused.n, 0) AS n,
               coalesce(agg.errors, 0) + coalesce(refused.n, 0) AS errors,
               agg.tokens, agg.ttft_p50, agg.ttft_p95, agg.itl_p95
        FROM generate_series(:start, :end - interval '1 minute', interval '1 minute') AS g
        LEFT JOIN agg ON agg.minute = g
        LEFT JOIN refused ON refused.minute = g
    )
    SELECT array_agg(extract(epoch FROM g)::bigint ORDER BY g),
           array_agg(n::int ORDER BY g),
           array_agg(round(n / 60.0, 4)::float8 ORDER BY g),
           array_agg(round(coalesce(tokens, 0) / 60.0, 3)::float8 ORDER BY g),
           array_agg(round(ttft_p50::numeric, 2)::float8 ORDER BY g),
           array_agg(round(ttft_p95::numeric, 2)::float8 ORDER BY g),
           array_agg(round(itl_p95::numeric, 2)::float8 ORDER BY g),
           array_agg(errors::int ORDER BY g),
           array_agg(CASE WHEN n > 0 THEN round(100.0 * errors / n, 2)::float8 ELSE 0 END
                     ORDER BY g)
    FROM per
    """
)
_SERIES_KEYS = (
    "t", "requests", "rps", "tok_s", "ttft_p50", "ttft_p95", "itl_p95", "errors", "error_pct"
)  # fmt: skip


def usage_series(session: Session, window: str, now: datetime | None = None) -> dict[str, Any]:
    """Per-minute series over the last hour or day: request rate (/s), output tokens/s, TTFT
    p50/p95 and ITL p95 (ms), errors and error rate (% of the minute's requests). Requests are
    usage rows plus refusals of the inference routes (request log, 4xx); errors are usage rows
    that failed plus those refusals. Every minute of the window is present (0 requests; None
    for a latency without requests). One statement: index-only time ranges, gaps filled and
    arrays built in PostgreSQL."""
    name = window if window in WINDOWS else "hour"
    end = (now or datetime.now(UTC)).replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - WINDOWS[name]
    params = {"start": start, "end": end, "paths": list(INFERENCE_PATHS)}
    row = session.execute(_SERIES_SQL, params).one()
    units = {"rps": "req/s", "tok_s": "tok/s", "ttft_p50": "ms", "ttft_p95": "ms",
             "itl_p95": "ms", "error_pct": "%"}  # fmt: skip
    return {"window": name, "units": units, "series": dict(zip(_SERIES_KEYS, row, strict=True))}


def tenants_page(session: Session, q: str = "", page: int = 1, sort: Sort | None = None) -> Page:
    """Tenants by name (a case-insensitive substring filter), with live key and adapter counts,
    in `sort`'s order (by name when None)."""
    sort = sort or parse_sort("tenants")
    page = page_number(page)
    where = [Tenant.name.ilike(_like(q.strip()))] if q.strip() else []
    total = session.scalar(select(func.count()).select_from(Tenant).where(*where)) or 0
    keys = (
        select(func.count())
        .where(ApiKey.tenant_id == Tenant.id, ApiKey.revoked_at.is_(None))
        .scalar_subquery()
    )
    adapters = (
        select(func.count())
        .where(Adapter.tenant_id == Tenant.id, Adapter.deleted_at.is_(None))
        .scalar_subquery()
    )
    columns = {
        "name": Tenant.name,
        "status": Tenant.suspended_at.is_not(None),
        "keys": keys,
        "adapters": adapters,
        "rpm": Tenant.requests_per_minute,
        "tpm": Tenant.tokens_per_minute,
        "quota": Tenant.monthly_token_quota,
        "created": Tenant.created_at,
    }
    stmt = (
        select(Tenant, keys.label("keys"), adapters.label("adapters"))
        .where(*where)
        .order_by(*ordered(sort, columns, Tenant.id))
        .limit(PAGE_SIZE)
        .offset((page - 1) * PAGE_SIZE)
    )
    return Page([row._mapping for row in session.execute(stmt)], page, int(total), sort=sort)


def tenant_adapters(session: Session, tenant_id: uuid.UUID) -> list[Any]:
    """A tenant's live adapters with their newest version's number and status."""
    newest = (
        select(AdapterVersion.adapter_id, func.max(AdapterVersion.n).label("n"))
        .where(AdapterVersion.tenant_id == tenant_id)
        .group_by(AdapterVersion.adapter_id)
        .subquery()
    )
    stmt = (
        select(Adapter, AdapterVersion)
        .outerjoin(newest, newest.c.adapter_id == Adapter.id)
        .outerjoin(
            AdapterVersion,
            and_(AdapterVersion.adapter_id == Adapter.id, AdapterVersion.n == newest.c.n),
        )
        .where(Adapter.tenant_id == tenant_id, Adapter.deleted_at.is_(None))
        .order_by(Adapter.name)
        .limit(500)
    )
    return [row._mapping for row in session.execute(stmt)]


def tenant_keys(session: Session, tenant_id: uuid.UUID) -> list[ApiKey]:
    """A tenant's keys, newest first (hashes are never shown)."""
    stmt = (
        select(ApiKey)
        .where(ApiKey.tenant_id == tenant_id)
        .order_by(ApiKey.created_at.desc())
        .limit(500)
    )
    return list(session.scalars(stmt))


def adapters_page(
    session: Session,
    status: str = "",
    base_model: str = "",
    tenant: str = "",
    page: int = 1,
    sort: Sort | None = None,
) -> Page:
    """Adapter versions across tenants in `sort`'s order (newest first when None); deleted
    adapters are left out."""
    sort = sort or parse_sort("adapters")
    page = page_number(page)
    where: list[ColumnElement[bool]] = [Adapter.deleted_at.is_(None)]
    if status:
        where.append(AdapterVersion.status == status)
    if base_model:
        ids = select(BaseModel.id).where(BaseModel.name == base_model)
        where.append(Adapter.base_model_id.in_(ids))
    if tenant:
        ids = select(Tenant.id).where(Tenant.name.ilike(_like(tenant.strip())))
        where.append(AdapterVersion.tenant_id.in_(ids))
    # The count joins only what the filters need (the page's 50 rows get the rest).
    counted = (
        select(func.count())
        .select_from(AdapterVersion)
        .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
        .where(*where)
    )
    total = session.scalar(counted) or 0
    base = (
        select(AdapterVersion, Adapter.name.label("adapter"), Tenant, BaseModel.name.label("base"))
        .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
        .join(Tenant, Tenant.id == AdapterVersion.tenant_id)
        .join(BaseModel, BaseModel.id == Adapter.base_model_id)
        .where(*where)
    )
    columns = {
        "created": AdapterVersion.created_at,
        "tenant": Tenant.name,
        "adapter": Adapter.name,
        "version": AdapterVersion.n,
        "base": BaseModel.name,
        "status": AdapterVersion.status,
        "rank": AdapterVersion.rank,
        "size": AdapterVersion.bytes,
    }
    stmt = (
        base.order_by(*ordered(sort, columns, AdapterVersion.id))
        .limit(PAGE_SIZE)
        .offset((page - 1) * PAGE_SIZE)
    )
    return Page([row._mapping for row in session.execute(stmt)], page, int(total), sort=sort)


def deployments_with_models(session: Session) -> tuple[list[Deployment], list[BaseModel]]:
    """Every deployment and every base model (both are few)."""
    deps = list(session.scalars(select(Deployment).order_by(Deployment.name)))
    models = list(session.scalars(select(BaseModel).order_by(BaseModel.name)))
    return deps, models


def jobs_page(
    session: Session, status: str = "", kind: str = "", page: int = 1, sort: Sort | None = None
) -> Page:
    """Background jobs in `sort`'s order (newest first when None), with the tenant's name and
    their version's status and validation error (a validation job that ran to its end may have
    failed the version)."""
    sort = sort or parse_sort("jobs")
    page = page_number(page)
    where = []
    if status:
        where.append(Job.status == status)
    if kind:
        where.append(Job.kind == kind)
    total = session.scalar(select(func.count()).select_from(Job).where(*where)) or 0
    columns = {
        "created": Job.created_at,
        "kind": Job.kind,
        "tenant": Tenant.name,
        "state": Job.status,
        "attempts": Job.attempts,
        "finished": Job.finished_at,
    }
    stmt = (
        select(
            Job,
            Tenant.name.label("tenant"),
            AdapterVersion.status.label("version_status"),
            AdapterVersion.error.label("version_error"),
        )
        .outerjoin(Tenant, Tenant.id == Job.tenant_id)
        .outerjoin(AdapterVersion, AdapterVersion.id == Job.subject_id)
        .where(*where)
        .order_by(*ordered(sort, columns, Job.id))
        .limit(PAGE_SIZE)
        .offset((page - 1) * PAGE_SIZE)
    )
    return Page([row._mapping for row in session.execute(stmt)], page, int(total), sort=sort)


def audit_page(
    session: Session,
    actor: str = "",
    action: str = "",
    tenant: str = "",
    page: int = 1,
    sort: Sort | None = None,
) -> Page:
    """Audit rows in `sort`'s order (newest first when None), filtered by actor, action prefix
    and tenant name."""
    sort = sort or parse_sort("audit")
    page = page_number(page)
    where = []
    if actor:
        where.append(AuditLog.actor.ilike(_like(actor.strip())))
    if action:
        where.append(AuditLog.action.like(action.strip().replace("%", "") + "%"))
    if tenant:
        ids = select(Tenant.id).where(Tenant.name.ilike(_like(tenant.strip())))
        where.append(AuditLog.tenant_id.in_(ids))
    total = session.scalar(select(func.count()).select_from(AuditLog).where(*where)) or 0
    columns = {
        "when": AuditLog.created_at,
        "actor": AuditLog.actor,
        "operator": Operator.email,
        "action": AuditLog.action,
        "resource": AuditLog.resource_type,
        "tenant": Tenant.name,
    }
    stmt = (
        select(AuditLog, Tenant.name.label("tenant"), Operator.email.label("operator"))
        .outerjoin(Tenant, Tenant.id == AuditLog.tenant_id)
        .outerjoin(Operator, Operator.id == AuditLog.operator_id)
        .where(*where)
        .order_by(*ordered(sort, columns, AuditLog.id.desc()))
        .limit(PAGE_SIZE)
        .offset((page - 1) * PAGE_SIZE)
    )
    return Page([row._mapping for row in session.execute(stmt)], page, int(total), sort=sort)


def tenant_usage_days(session: Session, tenant_id: uuid.UUID, days: int = 30) -> list[Any]:
    """A tenant's requests and tokens per day and per adapter (or base model), over the last
    `days` days counting today (from midnight UTC, as the chart's window)."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    since = today - timedelta(days=days - 1)
    day = func.date_trunc("day", UsageRecord.created_at).label("day")
    stmt = (
        select(
            day,
            UsageRecord.model,
            func.count().label("requests"),
            func.sum(UsageRecord.prompt_tokens).label("prompt_tokens"),
            func.sum(UsageRecord.completion_tokens).label("completion_tokens"),
            cast(func.avg(UsageRecord.latency_ms), Float).label("avg_latency_ms"),
        )
        .where(UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= since)
        .group_by(day, UsageRecord.model)
        .order_by(day, UsageRecord.model)
    )
    return [row._mapping for row in session.execute(stmt)]


def operators_list(session: Session) -> list[Operator]:
    """Every operator, owners first, then by email (they are few)."""
    order = (Operator.role != "owner", Operator.email)
    return list(session.scalars(select(Operator).order_by(*order).limit(1000)))

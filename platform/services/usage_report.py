"""A tenant's usage per day and per adapter (or base model): what `GET /v1/usage` returns."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

from sqlalchemy import Date, cast, func, select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import Adapter, AdapterVersion, UsageRecord


def usage_report_for(
    sessions: sessionmaker[Session],
    tenant_id: uuid.UUID,
    start: date | None = None,
    end: date | None = None,
) -> list[dict[str, Any]]:
    """`usage_report` in a session of its own (call it off the event loop)."""
    with sessions() as session:
        return usage_report(session, tenant_id, start, end)


def usage_report(
    session: Session, tenant_id: uuid.UUID, start: date | None = None, end: date | None = None
) -> list[dict[str, Any]]:
    """Per day and per adapter (or base model) totals for one tenant, oldest day first."""
    day = cast(func.date_trunc("day", UsageRecord.created_at), Date).label("day")
    cols = [
        day,
        UsageRecord.model,
        Adapter.name.label("adapter"),
        AdapterVersion.n.label("adapter_version"),
        func.count().label("requests"),
        func.sum(UsageRecord.prompt_tokens).label("prompt_tokens"),
        func.sum(UsageRecord.completion_tokens).label("completion_tokens"),
        func.sum(UsageRecord.cached_tokens).label("cached_tokens"),
        func.avg(UsageRecord.latency_ms).label("avg_latency_ms"),
    ]
    stmt = (
        select(*cols)
        .select_from(UsageRecord)
        .outerjoin(AdapterVersion, AdapterVersion.id == UsageRecord.adapter_version_id)
        .outerjoin(Adapter, Adapter.id == AdapterVersion.adapter_id)
        .where(UsageRecord.tenant_id == tenant_id)
        .group_by(day, UsageRecord.model, Adapter.name, AdapterVersion.n)
        .order_by(day, UsageRecord.model)
    )
    if start is not None:
        stmt = stmt.where(UsageRecord.created_at >= datetime.combine(start, datetime.min.time()))
    if end is not None:
        stmt = stmt.where(cast(UsageRecord.created_at, Date) <= end)
    out = []
    for row in session.execute(stmt).mappings():
        item = dict(row)
        item["day"] = item["day"].isoformat()
        for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            item[k] = int(item[k] or 0)
        item["avg_latency_ms"] = round(float(item["avg_latency_ms"] or 0.0), 1)
        out.append(item)
    return out

"""Tenants: search and pages, create, edit limits, suspend, delete; a tenant's page with its
keys (a new key's secret shown once), adapters, usage per day, and a CSV export."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, Response

from loraplex.platform.services import api_keys, tenants
from loraplex.platform.services import console_queries as cq
from loraplex.platform.services.console_paging import parse_sort
from loraplex.platform.services.errors import NotFound
from loraplex.platform.services.operators import SignedIn

from .auth import current_operator, writer
from .common import back_to, optional_int, page_arg, parse_uuid, transaction
from .views import SECURITY_HEADERS, render

router = APIRouter()
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "monthly_token_quota")


@router.get("/tenants", response_class=HTMLResponse)
def tenants_list(
    request: Request,
    q: str = "",
    page: str = "1",
    sort: str = "",
    order: str = Query("", alias="dir"),
    who: SignedIn = Depends(current_operator),
) -> HTMLResponse:
    """Tenants, 50 a page, with a search box; sorted (by name unless asked) in the database."""
    search = q[:128]
    order_by = parse_sort("tenants", sort, order)
    with transaction(request) as session:
        result = cq.tenants_page(session, search, page_arg(page), order_by)
        return render(
            request,
            "tenants.html",
            who=who,
            active="tenants",
            result=result,
            q=search,
            msg=request.query_params.get("msg", ""),
            title="Tenants",
        )


@router.post("/tenants")
async def tenant_create(
    request: Request, name: str = Form(""), who: SignedIn = Depends(writer)
) -> Response:
    """Create a tenant, then show its page."""
    form = await request.form()
    limits = {f: optional_int(form.get(f), f) for f in LIMIT_FIELDS}  # type: ignore[arg-type]
    with transaction(request, who) as session:
        tenant = tenants.create_tenant(
            session,
            name,
            limits={k: v for k, v in limits.items() if v is not None},
            actor=who.actor,
        )
        tid = tenant.id
    return back_to(f"/console/tenants/{tid}", msg="Tenant created.")


CHART_DAYS = 30


def usage_chart(rows: list, now: datetime | None = None, days: int = CHART_DAYS) -> dict:
    """The tenant page's chart: requests per day over the last `days` days (every day present,
    0 without requests, so lines join), one series per model or adapter (the 8 busiest); the x
    axis is that window in unix seconds (`x_range`), whatever days have data."""
    today = (now or datetime.now(UTC)).astimezone(UTC)
    today = today.replace(hour=0, minute=0, second=0, microsecond=0)
    t = [int((today - timedelta(days=days - 1 - i)).timestamp()) for i in range(days)]
    index = {d: i for i, d in enumerate(t)}
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["model"]] = totals.get(r["model"], 0) + int(r["requests"])
    models = sorted(totals, key=lambda m: -totals[m])[:8]
    series = {m: [0] * len(t) for m in models}
    for r in rows:
        at = index.get(int(r["day"].astimezone(UTC).timestamp()))
        if r["model"] in series and at is not None:
            series[r["model"]][at] += int(r["requests"])
    return {
        "t": t,
        "x_range": [t[0], t[-1]],
        "series": [{"label": m, "values": series[m]} for m in models],
    }


def _tenant_page(request: Request, who: SignedIn, tenant_id: str, **extra) -> HTMLResponse:
    tid = parse_uuid(tenant_id, "tenant")
    with transaction(request) as session:
        tenant = tenants.get_tenant(session, tid)
        usage = cq.tenant_usage_days(session, tid)
        return render(
            request,
            "tenant.html",
            who=who,
            active="tenants",
            tenant=tenant,
            keys=cq.tenant_keys(session, tid),
            adapters=cq.tenant_adapters(session, tid),
            usage=usage,
            usage_chart=usage_chart(usage),
            msg=request.query_params.get("msg", ""),
            title=f"Tenant {tenant.name}",
            crumbs=[("Tenants", "/console/tenants")],
            new_key=extra.get("new_key"),
            status=extra.get("status", 200),
        )


@router.get("/tenants/{tenant_id}", response_class=HTMLResponse)
def tenant_page(
    request: Request, tenant_id: str, who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """One tenant: limits, keys, adapters, usage."""
    return _tenant_page(request, who, tenant_id)


@router.get("/tenants/{tenant_id}/adapters", response_class=HTMLResponse)
def tenant_adapters_partial(
    request: Request, tenant_id: str, who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """The tenant's adapter table alone (htmx polls it while a version validates)."""
    tid = parse_uuid(tenant_id, "tenant")
    with transaction(request) as session:
        tenants.get_tenant(session, tid)
        rows = cq.tenant_adapters(session, tid)
        return render(request, "_tenant_adapters.html", who=who, adapters=rows, tenant_id=str(tid))


@router.post("/tenants/{tenant_id}/limits")
async def tenant_limits(
    request: Request, tenant_id: str, who: SignedIn = Depends(writer)
) -> Response:
    """Set the tenant's RPM, TPM and monthly quota (empty: back to the default)."""
    tid = parse_uuid(tenant_id, "tenant")
    form = await request.form()
    changes = {f: optional_int(form.get(f), f) for f in LIMIT_FIELDS}  # type: ignore[arg-type]
    with transaction(request, who) as session:
        tenants.update_limits(session, tid, changes, actor=who.actor)
    return back_to(f"/console/tenants/{tid}", msg="Limits saved.")


@router.post("/tenants/{tenant_id}/suspend")
async def tenant_suspend(
    request: Request, tenant_id: str, who: SignedIn = Depends(writer)
) -> Response:
    """Suspend (every key refused at once) or lift the suspension (`action=resume`)."""
    tid = parse_uuid(tenant_id, "tenant")
    form = await request.form()
    suspend = form.get("action", "suspend") != "resume"
    with transaction(request, who) as session:
        tenants.set_suspended(session, tid, suspend, actor=who.actor)
    return back_to(f"/console/tenants/{tid}", msg="Suspended." if suspend else "Resumed.")


@router.post("/tenants/{tenant_id}/delete")
async def tenant_delete(
    request: Request, tenant_id: str, who: SignedIn = Depends(writer)
) -> Response:
    """Delete a tenant that has no adapters left."""
    tid = parse_uuid(tenant_id, "tenant")
    with transaction(request, who) as session:
        name = tenants.delete_tenant(session, tid, actor=who.actor)
    return back_to("/console/tenants", msg=f"Deleted {name}.")


@router.post("/tenants/{tenant_id}/keys", response_class=HTMLResponse)
async def key_create(
    request: Request, tenant_id: str, name: str = Form("console"), who: SignedIn = Depends(writer)
) -> HTMLResponse:
    """Issue a key: its secret is in this response only (never stored, never shown again)."""
    tid = parse_uuid(tenant_id, "tenant")
    with transaction(request, who) as session:
        key, plain = api_keys.create_api_key(session, tid, name or "console", actor=who.actor)
        shown = {"name": key.name, "prefix": key.prefix, "key": plain}
    return _tenant_page(request, who, str(tid), new_key=shown, status=201)


@router.post("/tenants/{tenant_id}/keys/{key_id}/revoke")
async def key_revoke(
    request: Request, tenant_id: str, key_id: str, who: SignedIn = Depends(writer)
) -> Response:
    """Revoke a key: requests with it are refused from now on."""
    tid, kid = parse_uuid(tenant_id, "tenant"), parse_uuid(key_id, "api_key")
    with transaction(request, who) as session:
        key = api_keys.revoke_api_key(session, kid, actor=who.actor)
        if key.tenant_id != tid:
            raise NotFound(f"no API key with id {kid}", code="api_key_not_found")
    return back_to(f"/console/tenants/{tid}", msg="Key revoked.")


@router.get("/tenants/{tenant_id}/usage.csv")
def usage_csv(
    request: Request, tenant_id: str, who: SignedIn = Depends(current_operator)
) -> Response:
    """The tenant's usage per day and model over the last 30 days, as CSV."""
    tid = parse_uuid(tenant_id, "tenant")
    with transaction(request) as session:
        tenant = tenants.get_tenant(session, tid)
        rows = cq.tenant_usage_days(session, tid)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["day", "model", "requests", "prompt_tokens", "completion_tokens", "avg_latency_ms"])
    for r in rows:
        w.writerow(
            [
                r["day"].date().isoformat(),
                _csv_safe(r["model"]),
                r["requests"],
                int(r["prompt_tokens"] or 0),
                int(r["completion_tokens"] or 0),
                round(float(r["avg_latency_ms"] or 0), 1),
            ]
        )
    headers = {
        **SECURITY_HEADERS,
        "content-disposition": f'attachment; filename="usage-{tenant.id}.csv"',
    }
    return Response(out.getvalue(), media_type="text/csv", headers=headers)


def _csv_safe(value: str) -> str:
    """A cell a spreadsheet will not run as a formula."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value

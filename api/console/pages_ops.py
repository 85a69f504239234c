"""Jobs (state, attempts, errors; retry a failed validation) and the audit log."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from loraplex.platform.db.models import JOB_STATUSES
from loraplex.platform.services import admin_actions
from loraplex.platform.services import console_queries as cq
from loraplex.platform.services import job_records as records
from loraplex.platform.services.console_paging import parse_sort
from loraplex.platform.services.operators import SignedIn

from ..deps import get_dispatcher
from .auth import current_operator, writer
from .common import back_to, page_arg, parse_uuid, transaction
from .views import render

router = APIRouter()


@router.get("/jobs", response_class=HTMLResponse)
def jobs_list(
    request: Request,
    status: str = "",
    kind: str = "",
    page: str = "1",
    sort: str = "",
    order: str = Query("", alias="dir"),
    who: SignedIn = Depends(current_operator),
) -> HTMLResponse:
    """Background jobs, sorted (newest first unless asked) in the database."""
    status = status if status in JOB_STATUSES else ""
    kind = kind if kind in records.KINDS else ""
    order_by = parse_sort("jobs", sort, order)
    with transaction(request) as session:
        result = cq.jobs_page(session, status, kind, page_arg(page), order_by)
        return render(
            request,
            "jobs.html",
            who=who,
            active="jobs",
            result=result,
            statuses=JOB_STATUSES,
            kinds=records.KINDS,
            f={"status": status, "kind": kind},
            msg=request.query_params.get("msg", ""),
            title="Jobs",
        )


@router.post("/jobs/{job_id}/retry")
async def job_retry(request: Request, job_id: str, who: SignedIn = Depends(writer)) -> Response:
    """Validate a failed job's version again (a new job)."""
    jid = parse_uuid(job_id, "job")
    dispatcher = get_dispatcher(request)
    with transaction(request, who) as session:
        job = admin_actions.retry_validation(session, jid, actor=who.actor)
        new_id = job.id
    dispatcher.send(records.VALIDATE, new_id)
    return back_to("/console/jobs", msg="Validation queued again.")


@router.get("/audit", response_class=HTMLResponse)
def audit_list(
    request: Request,
    actor: str = "",
    action: str = "",
    tenant: str = "",
    page: str = "1",
    sort: str = "",
    order: str = Query("", alias="dir"),
    who: SignedIn = Depends(current_operator),
) -> HTMLResponse:
    """Who did what and when, sorted (newest first unless asked) in the database."""
    order_by = parse_sort("audit", sort, order)
    with transaction(request) as session:
        result = cq.audit_page(
            session, actor[:128], action[:64], tenant[:128], page_arg(page), order_by
        )
        return render(
            request,
            "audit.html",
            who=who,
            active="audit",
            result=result,
            f={"actor": actor, "action": action, "tenant": tenant},
            title="Audit log",
        )

"""Request lookup: a tenant reports the request id of an error; the operator pastes it and
sees that request as the API logged it (tenant, key, route, status, timing, the message the
tenant saw and the detail it did not). Kept for `request_log_retention_days`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from loraplex.platform.services import request_log
from loraplex.platform.services.operators import SignedIn

from ..deps import get_settings
from .auth import current_operator
from .common import transaction
from .views import render

router = APIRouter()


@router.get("/requests", response_class=HTMLResponse)
def request_lookup(
    request: Request, id: str = "", who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """The lookup form and, for an id, what was logged about it."""
    rid = id.strip()[:128]
    found = None
    if rid:
        with transaction(request) as session:
            found = request_log.find(session, rid)
    return render(
        request,
        "requests.html",
        status=200 if found is not None or not rid else 404,
        who=who,
        active="requests",
        rid=rid,
        found=found,
        retention_days=get_settings(request).request_log_retention_days,
        title="Request lookup",
    )

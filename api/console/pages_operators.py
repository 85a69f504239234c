"""Operators (owners only change them): list, invite with a one-time link, change role,
disable or enable, reset a password (a new one-time link); the last owner is kept. The
one-time link's page lets the invitee set a password and signs them in."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, Response

from loraplex.platform.db.models import OPERATOR_ROLES
from loraplex.platform.db.session import session_scope
from loraplex.platform.services import console_queries as cq
from loraplex.platform.services import operators
from loraplex.platform.services.errors import InvalidInput
from loraplex.platform.services.operators import SignedIn

from ..deps import get_sessions
from .auth import PRE_CSRF_COOKIE, check_csrf, current_operator, pre_csrf_token, set_cookie, writer
from .common import back_to, forbid, parse_uuid, transaction
from .pages_auth import signed_in_response
from .views import render

router = APIRouter()


def owner(who: SignedIn = Depends(writer)) -> SignedIn:
    """A change to operators: owners only (viewers are refused before, by `writer`)."""
    if who.role != "owner":
        raise forbid("Only owners manage operators.")
    return who


def _link(request: Request, token: str) -> str:
    return str(request.base_url).rstrip("/") + f"/console/set-password/{token}"


def _page(request: Request, who: SignedIn, status: int = 200, **shown: str) -> HTMLResponse:
    with transaction(request) as session:
        rows = cq.operators_list(session)
        return render(
            request,
            "operators.html",
            status=status,
            who=who,
            active="operators",
            rows=rows,
            roles=OPERATOR_ROLES,
            link=shown.get("link", ""),
            link_for=shown.get("link_for", ""),
            msg=request.query_params.get("msg", ""),
            title="Operators",
        )


@router.get("/operators", response_class=HTMLResponse)
def operators_page(request: Request, who: SignedIn = Depends(current_operator)) -> HTMLResponse:
    """Every operator with role, state and last sign-in."""
    return _page(request, who)


@router.post("/operators", response_class=HTMLResponse)
def operator_invite(
    request: Request,
    email: str = Form(""),
    role: str = Form("viewer"),
    who: SignedIn = Depends(owner),
) -> HTMLResponse:
    """Invite: the one-time link is shown in this answer only."""
    with transaction(request, who) as session:
        op, token = operators.invite_operator(
            session, email, role, actor=who.actor, operator_id=who.operator_id
        )
        address = op.email
    return _page(request, who, 201, link=_link(request, token), link_for=address)


@router.post("/operators/{operator_id}/role")
def operator_role(
    request: Request, operator_id: str, role: str = Form(""), who: SignedIn = Depends(owner)
) -> Response:
    """Change an operator's role (409 for the last owner)."""
    oid = parse_uuid(operator_id, "operator")
    with transaction(request, who) as session:
        op = operators.change_role(session, oid, role, actor=who.actor, operator_id=who.operator_id)
        email = op.email
    return back_to("/console/operators", msg=f"{email} is now {role}.")


@router.post("/operators/{operator_id}/disable")
def operator_disable(
    request: Request,
    operator_id: str,
    action: str = Form("disable"),
    who: SignedIn = Depends(owner),
) -> Response:
    """Disable (sessions end at once) or enable (`action=enable`) an operator."""
    oid = parse_uuid(operator_id, "operator")
    disable = action != "enable"
    with transaction(request, who) as session:
        op = operators.set_disabled(
            session, oid, disable, actor=who.actor, operator_id=who.operator_id
        )
        email = op.email
    return back_to("/console/operators", msg=f"{email} {'disabled' if disable else 'enabled'}.")


@router.post("/operators/{operator_id}/reset", response_class=HTMLResponse)
def operator_reset(
    request: Request, operator_id: str, who: SignedIn = Depends(owner)
) -> HTMLResponse:
    """Reset a password: the old one stops working; the one-time link is shown once."""
    oid = parse_uuid(operator_id, "operator")
    with transaction(request, who) as session:
        op, token = operators.reset_password(
            session, oid, actor=who.actor, operator_id=who.operator_id
        )
        address = op.email
    return _page(request, who, link=_link(request, token), link_for=address)


def _set_password_page(
    request: Request, token: str, error: str = "", status: int = 200
) -> HTMLResponse:
    with session_scope(get_sessions(request)) as session:
        op = operators.operator_for_link(session, token)
        email = op.email if op is not None else ""
    csrf = pre_csrf_token(request)
    page = render(request, "set_password.html", status=status if email else 404, email=email,
                  token=token, csrf=csrf, error=error, title="Set your password")  # fmt: skip
    set_cookie(request, page, PRE_CSRF_COOKIE, csrf, max_age=3600)
    return page


@router.get("/set-password/{token}", response_class=HTMLResponse)
def set_password_form(request: Request, token: str) -> HTMLResponse:
    """The one-time link's page: choose a password."""
    return _set_password_page(request, token)


@router.post("/set-password/{token}")
async def set_password(request: Request, token: str, password: str = Form("")) -> Response:
    """Set the password (the link is spent) and sign in."""
    await check_csrf(request, request.cookies.get(PRE_CSRF_COOKIE, ""))

    def run() -> Response:
        try:
            with transaction(request) as session:
                op = operators.set_password_with_link(session, token, password)
                op_id = op.id
        except InvalidInput as exc:
            return _set_password_page(request, token, exc.message, exc.status)
        return signed_in_response(request, op_id)

    return await run_in_threadpool(run)

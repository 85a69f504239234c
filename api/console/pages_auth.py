"""Sign-in (email and password, or the admin key once to create the first owner), sign-out."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from loraplex.platform.db.models import Operator
from loraplex.platform.db.session import session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.services import operators
from loraplex.platform.services.audit import ADMIN_ACTOR
from loraplex.platform.services.errors import ServiceError

from ..deps import get_sessions, get_settings
from .auth import (
    PRE_CSRF_COOKIE,
    SESSION_COOKIE,
    check_csrf,
    current_operator,
    limiter_for,
    pre_csrf_token,
    set_cookie,
)
from .common import transaction
from .views import render

router = APIRouter()


def _client(request: Request) -> str:
    return "ip:" + (request.client.host if request.client else "unknown")


def _sign_in_page(request: Request, *, error: str = "", status: int = 200) -> HTMLResponse:
    with session_scope(get_sessions(request)) as session:
        first = operators.count_operators(session) == 0
    token = pre_csrf_token(request)
    resp = render(
        request,
        "sign_in.html",
        status=status,
        first_owner=first,
        error=error,
        csrf=token,
        title="Sign in",
    )
    set_cookie(request, resp, PRE_CSRF_COOKIE, token, max_age=3600)
    return resp


def _signed_in(request: Request, op_id) -> Response:
    with transaction(request) as session:
        op = session.get(Operator, op_id)
        token = operators.start_session(session, op)
    resp = RedirectResponse("/console/", status_code=303)
    set_cookie(request, resp, SESSION_COOKIE, token, max_age=None)
    resp.delete_cookie(PRE_CSRF_COOKIE, path="/console")
    return resp


def _throttled(request: Request, email: str) -> None:
    wait = limiter_for(request).blocked(_client(request), "email:" + email.strip().lower())
    if wait > 0:
        raise HttpError(
            429,
            f"Too many failed sign-ins; try again in {int(wait) + 1} seconds.",
            code="rate_limited",
            headers={"Retry-After": str(int(wait) + 1)},
        )


@router.get("/sign-in", response_class=HTMLResponse)
def sign_in_form(request: Request) -> HTMLResponse:
    """The sign-in page (and the first-owner form while no operator exists)."""
    return _sign_in_page(request)


@router.post("/sign-in")
async def sign_in(request: Request, email: str = Form(""), password: str = Form("")) -> Response:
    """Email and password: a new session cookie, or the form again with a generic error."""
    await check_csrf(request, request.cookies.get(PRE_CSRF_COOKIE, ""))
    _throttled(request, email)
    with transaction(request) as session:
        op = operators.authenticate(session, email, password)
        op_id = op.id if op is not None else None
    if op_id is None:
        limiter_for(request).failed(_client(request), "email:" + email.strip().lower())
        return _sign_in_page(request, error="Wrong email or password.", status=401)
    return _signed_in(request, op_id)


@router.post("/first-owner")
async def first_owner(
    request: Request,
    admin_key: str = Form(""),
    email: str = Form(""),
    password: str = Form(""),
) -> Response:
    """While no operator exists: the admin key creates the first owner and signs them in."""
    await check_csrf(request, request.cookies.get(PRE_CSRF_COOKIE, ""))
    _throttled(request, "admin-key")
    configured = get_settings(request).admin_key or ""
    if not configured or not hmac.compare_digest(admin_key.encode(), configured.encode()):
        limiter_for(request).failed(_client(request), "email:admin-key")
        return _sign_in_page(request, error="That is not the admin key.", status=401)
    try:
        with transaction(request) as session:
            if operators.count_operators(session) > 0:
                raise HttpError(409, "An owner exists already; sign in.", code="owner_exists")
            op = operators.create_operator(session, email, password, "owner", actor=ADMIN_ACTOR)
            op_id = op.id
    except ServiceError as exc:
        return _sign_in_page(request, error=exc.message, status=exc.status)
    return _signed_in(request, op_id)


@router.post("/sign-out")
async def sign_out(request: Request, who=Depends(current_operator)) -> Response:
    """End the session (its row is removed) and clear the cookie."""
    await check_csrf(request, who.csrf_token)
    with transaction(request) as session:
        operators.end_session(session, request.cookies.get(SESSION_COOKIE, ""))
    resp = RedirectResponse("/console/sign-in", status_code=303)
    resp.delete_cookie(SESSION_COOKIE, path="/console")
    return resp

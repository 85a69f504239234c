"""Sign-in (email and password, or the admin key once to create the first owner), sign-out.

Everything a sign-in does (the limits in Redis, the database, the argon2 check of ~0.3 s) runs
in a low-priority worker thread, never on the event loop; at most one argon2 check per core runs at once and
at most MAX_WAITING sign-ins wait for one (then 503), so a flood of sign-ins cannot stall the
API nor fill its memory."""

from __future__ import annotations

import hmac
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from fastapi import APIRouter, Depends, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from loraplex.platform.cores import usable_cores
from loraplex.platform.db.models import Operator
from loraplex.platform.db.session import session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.low_priority import run_low_priority
from loraplex.platform.services import operators
from loraplex.platform.services.audit import ADMIN_ACTOR
from loraplex.platform.services.errors import ServiceError

from ..deps import get_sessions, get_settings
from .auth import (
    PRE_CSRF_COOKIE,
    SESSION_COOKIE,
    check_csrf,
    client_of,
    current_operator,
    limiter_for,
    pre_csrf_token,
    set_cookie,
)
from .common import transaction
from .signin_limits import Refusal, SignInLimits
from .views import render

router = APIRouter()


_HASHING = threading.BoundedSemaphore(usable_cores())
MAX_WAITING = 64
_waiting = 0
_waiting_lock = threading.Lock()


@contextmanager
def _admitted() -> Any:
    """A place among the sign-ins in flight (503 when MAX_WAITING are already waiting)."""
    global _waiting
    with _waiting_lock:
        if _waiting >= MAX_WAITING:
            raise HttpError(503, "Too many sign-ins at once; try again in a moment.",
                            code="busy", headers={"Retry-After": "1"})  # fmt: skip
        _waiting += 1
    try:
        yield
    finally:
        with _waiting_lock:
            _waiting -= 1


def _account(email: str) -> str:
    return (email or "").strip().lower()[:254]


def _too_many(refusal: Refusal) -> HttpError:
    return HttpError(429, refusal.message, code="rate_limited",
                     headers={"Retry-After": str(refusal.retry_after)})  # fmt: skip


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Run `fn` in a low-priority worker thread (`platform/low_priority.py`: a sign-in flood
    slows itself, not the completions beside it), counted among the sign-ins in flight."""

    def run() -> Any:
        with _admitted():
            return fn(*args)

    return await run_low_priority(run)


def _sign_in_page(request: Request, error: str = "", status: int = 200) -> HTMLResponse:
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


def signed_in_response(request: Request, op_id: uuid.UUID) -> Response:
    """A new session for `op_id`: the cookie and a redirect to the overview."""
    with transaction(request) as session:
        op = session.get(Operator, op_id)
        if op is None:  # removed between the password check and here
            raise HttpError(401, "Wrong email or password.", code="invalid_credentials")
        token = operators.start_session(session, op)
    resp = RedirectResponse("/console/", status_code=303)
    set_cookie(request, resp, SESSION_COOKIE, token, max_age=None)
    resp.delete_cookie(PRE_CSRF_COOKIE, path="/console")
    return resp


@router.get("/sign-in", response_class=HTMLResponse)
def sign_in_form(request: Request) -> HTMLResponse:
    """The sign-in page (and the first-owner form while no operator exists)."""
    return _sign_in_page(request)


def _check_password(
    request: Request, limits: SignInLimits, account: str, address: str, password: str
) -> uuid.UUID | Refusal | None:
    """In a worker thread: the limits, then the argon2 check (one per core at a time)."""
    refusal = limits.check(account, address)
    if refusal is not None:
        return refusal
    with _HASHING, transaction(request) as session:
        op = operators.authenticate(session, account, password)
        op_id = op.id if op is not None else None
    if op_id is None:
        limits.failed(account, address)
    else:
        limits.succeeded(account)
    return op_id


@router.post("/sign-in")
async def sign_in(request: Request, email: str = Form(""), password: str = Form("")) -> Response:
    """Email and password: a new session cookie, or the form again with a generic error."""
    await check_csrf(request, request.cookies.get(PRE_CSRF_COOKIE, ""))
    limits = limiter_for(request)
    address = client_of(request, limits)
    outcome = await _off_loop(_check_password, request, limits, _account(email), address, password)
    if isinstance(outcome, Refusal):
        await limits.pause.pause(address)
        raise _too_many(outcome)
    if outcome is None:
        return await _off_loop(_sign_in_page, request, "Wrong email or password.", 401)
    return await _off_loop(signed_in_response, request, outcome)


def _create_owner(
    request: Request, limits: SignInLimits, address: str, admin_key: str, email: str, password: str
) -> uuid.UUID | Refusal | Response:
    """In a worker thread: the limits, the admin key, then the owner (hashing its password)."""
    refusal = limits.check("admin-key", address)
    if refusal is not None:
        return refusal
    configured = get_settings(request).admin_key or ""
    if not configured or not hmac.compare_digest(admin_key.encode(), configured.encode()):
        limits.failed("admin-key", address)
        return _sign_in_page(request, "That is not the admin key.", 401)
    try:
        with _HASHING, transaction(request) as session:
            if operators.count_operators(session) > 0:
                raise HttpError(409, "An owner exists already; sign in.", code="owner_exists")
            op = operators.create_operator(session, email, password, "owner", actor=ADMIN_ACTOR)
            return op.id
    except ServiceError as exc:
        return _sign_in_page(request, exc.message, exc.status)


@router.post("/first-owner")
async def first_owner(
    request: Request,
    admin_key: str = Form(""),
    email: str = Form(""),
    password: str = Form(""),
) -> Response:
    """While no operator exists: the admin key creates the first owner and signs them in."""
    await check_csrf(request, request.cookies.get(PRE_CSRF_COOKIE, ""))
    limits = limiter_for(request)
    address = client_of(request, limits)
    outcome = await _off_loop(_create_owner, request, limits, address, admin_key, email, password)
    if isinstance(outcome, Refusal):
        await limits.pause.pause(address)
        raise _too_many(outcome)
    if isinstance(outcome, Response):
        return outcome
    return await _off_loop(signed_in_response, request, outcome)


@router.post("/sign-out")
async def sign_out(request: Request, who=Depends(current_operator)) -> Response:
    """End the session (its row is removed) and clear the cookie."""
    await check_csrf(request, who.csrf_token)

    def end() -> None:
        with transaction(request) as session:
            operators.end_session(session, request.cookies.get(SESSION_COOKIE, ""))

    await run_in_threadpool(end)
    resp = RedirectResponse("/console/sign-in", status_code=303)
    resp.delete_cookie(SESSION_COOKIE, path="/console")
    return resp

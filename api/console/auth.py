"""Console sign-in state: the session cookie, the CSRF check on every state-changing request,
the viewer's read-only rule, and where the sign-in limits live."""

from __future__ import annotations

import hmac
import secrets
from datetime import timedelta

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.session import session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.services import operators
from loraplex.platform.services.operators import SignedIn

from ..deps import get_sessions, get_settings
from .signin_limits import SignInLimits, client_address, limits_for

SESSION_COOKIE = "lp_console"
PRE_CSRF_COOKIE = "lp_console_pre"  # double-submit token of the sign-in forms
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
COOKIE_PATH = "/console"


class SignInRequired(Exception):
    """No (live) session: the page handler answers with a redirect to the sign-in page."""


def secure_request(request: Request) -> bool:
    """True over https (the cookie then carries `Secure`)."""
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return proto.split(",")[0].strip() == "https"


def set_cookie(request: Request, response, name: str, value: str, max_age: int | None) -> None:
    """An HttpOnly, SameSite=Strict cookie under /console (Secure over https)."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=secure_request(request),
    )


def current_operator(
    request: Request, sessions: sessionmaker[Session] = Depends(get_sessions)
) -> SignedIn:
    """The signed-in operator (SignInRequired otherwise); idle sessions are ended."""
    token = request.cookies.get(SESSION_COOKIE, "")
    idle = timedelta(seconds=get_settings(request).console_idle_timeout_s)
    with session_scope(sessions) as session:
        who = operators.resume_session(session, token, idle) if token else None
    if who is None:
        raise SignInRequired()
    request.state.operator = who
    return who


async def _sent_token(request: Request) -> str:
    header = request.headers.get(CSRF_HEADER)
    if header:
        return header
    form = await request.form()
    value = form.get(CSRF_FIELD)
    return value if isinstance(value, str) else ""


async def writer(request: Request, who: SignedIn = Depends(current_operator)) -> SignedIn:
    """A state-changing request: the session's CSRF token must come with it (form field or
    `X-CSRF-Token`), and the role must be allowed to change things (403 for viewers)."""
    await check_csrf(request, who.csrf_token)
    if not who.can_write:
        raise HttpError(403, "Viewers can look but not change anything.", code="read_only_role")
    return who


async def check_csrf(request: Request, expected: str) -> None:
    """403 unless the request carries `expected` (constant-time comparison)."""
    sent = await _sent_token(request)
    if not expected or not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise HttpError(
            403, "The form's security token is missing or stale; reload the page.", code="csrf"
        )


def pre_csrf_token(request: Request) -> str:
    """The sign-in forms' double-submit token (kept in a cookie, echoed in the form)."""
    token = request.cookies.get(PRE_CSRF_COOKIE, "")
    return token if 20 <= len(token) <= 64 else secrets.token_urlsafe(24)


def limiter_for(request: Request) -> SignInLimits:
    """The app's sign-in limits (made on first use; Redis-backed, see signin_limits)."""
    lim = getattr(request.app.state, "console_limits", None)
    if lim is None:
        lim = limits_for(get_settings(request))
        request.app.state.console_limits = lim
    return lim


def client_of(request: Request, limits: SignInLimits) -> str:
    """The client address the limits count against (trusted proxies' header only)."""
    peer = request.client.host if request.client else "unknown"
    return client_address(peer, request.headers.get("x-forwarded-for"), limits.networks)

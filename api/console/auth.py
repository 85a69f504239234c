"""Console sign-in state: the session cookie, the CSRF check on every state-changing request,
the viewer's read-only rule, and the sign-in rate limit."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import deque
from datetime import timedelta

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.session import session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.services import operators
from loraplex.platform.services.operators import SignedIn

from ..deps import get_sessions, get_settings

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


class SignInLimiter:
    """Failed sign-ins per client address and per email in a sliding window (this process)."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._fails: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        q = self._fails.setdefault(key, deque())
        while q and now - q[0] > self.window_s:
            q.popleft()
        return q

    def blocked(self, *keys: str) -> float:
        """Seconds to wait before another attempt (0: go ahead)."""
        now = time.monotonic()
        with self._lock:
            waits = [
                self.window_s - (now - q[0])
                for q in (self._recent(k, now) for k in keys)
                if len(q) >= self.limit
            ]
        return max(waits, default=0.0)

    def failed(self, *keys: str) -> None:
        """Count one failure against every key."""
        now = time.monotonic()
        with self._lock:
            for k in keys:
                self._recent(k, now).append(now)
            if len(self._fails) > 100_000:  # bound memory under a spray of addresses
                self._fails = {k: q for k, q in self._fails.items() if q}


def limiter_for(request: Request) -> SignInLimiter:
    """The app's sign-in limiter (made on first use)."""
    lim = getattr(request.app.state, "console_limiter", None)
    if lim is None:
        s = get_settings(request)
        lim = SignInLimiter(s.console_signin_failures, s.console_signin_window_s)
        request.app.state.console_limiter = lim
    return lim

"""Helpers the console's page modules share: a DB transaction stamped with the operator,
redirects after a change, form parsing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from loraplex.platform.db.session import session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.services import audit
from loraplex.platform.services.errors import InvalidInput, NotFound
from loraplex.platform.services.operators import SignedIn

from ..deps import get_sessions


@contextmanager
def transaction(request: Request, who: SignedIn | None = None) -> Iterator[Session]:
    """One committed transaction; audit rows written in it name `who`."""
    with session_scope(get_sessions(request)) as session:
        if who is not None:
            audit.stamp_operator(session, who.operator_id)
        yield session


def back_to(path: str, **query: str) -> RedirectResponse:
    """303 to a console page after a change (so a reload does not post again)."""
    qs = urlencode({k: v for k, v in query.items() if v})
    return RedirectResponse(path + (f"?{qs}" if qs else ""), status_code=303)


def parse_uuid(value: str, what: str) -> uuid.UUID:
    """A path id, or 404 naming what was asked for."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(f"no {what} with id {value[:64]!r}", code=f"{what}_not_found") from None


def optional_int(value: str | None, field: str) -> int | None:
    """A form number: empty means None (the default); otherwise a whole number."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"{field} must be a whole number", param=field) from None


def page_arg(value: str | None) -> int:
    """A `page` query value (1 when missing or not a number)."""
    try:
        return max(1, int(value or 1))
    except ValueError:
        return 1


def forbid(message: str) -> HttpError:
    """A 403 for something this operator may not do."""
    return HttpError(403, message, code="forbidden")

"""Every console request's identifiers are checked at the edge: a control character (NUL
included) in a path segment, a query value or a form field is a 400 page naming the field,
before anything reaches PostgreSQL (which refuses NUL with a 500 otherwise)."""

from __future__ import annotations

from fastapi import Request

from loraplex.platform.services.errors import InvalidInput
from loraplex.platform.services.names import CONTROL_CHARACTERS

# Secrets are never stored as text nor searched: only NUL is refused in them.
_SECRET_FIELDS = frozenset({"password", "admin_key", "csrf_token"})
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _check(field: str, value: str) -> None:
    bad = "\x00" in value if field in _SECRET_FIELDS else bool(CONTROL_CHARACTERS.search(value))
    if bad or CONTROL_CHARACTERS.search(field):
        shown = CONTROL_CHARACTERS.sub("?", field)[:64]
        raise InvalidInput(
            f"The field `{shown}` contains a control character; remove it and try again.",
            code="invalid_characters",
            param=shown,
        )


async def refuse_control_characters(request: Request) -> None:
    """A FastAPI dependency of every console route (see `install_console`)."""
    for name, value in request.path_params.items():
        _check(name, str(value))
    for name, value in request.query_params.multi_items():
        _check(name, value)
    content_type = request.headers.get("content-type", "")
    if request.method == "POST" and content_type.startswith(_FORM_TYPES):
        form = await request.form()
        for name, value in form.multi_items():
            if isinstance(value, str):
                _check(name, value)

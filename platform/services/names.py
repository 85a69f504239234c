"""Rules for names clients choose (tenants, adapters, keys, deployments): short, no paths."""

from __future__ import annotations

import re

from .errors import InvalidInput

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
"""C0 controls and DEL, NUL among them: never in a name or id (PostgreSQL refuses NUL in text)."""


def has_control_characters(text: str) -> bool:
    """Whether `text` holds a control character (the edge refuses names and ids with one)."""
    return CONTROL_CHARACTERS.search(text) is not None


def check_name(value: object, what: str, max_length: int) -> str:
    """Return `value` if it is a safe resource name, else raise InvalidInput naming the rule."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{what} must be a non-empty string", code="invalid_name", param=what)
    if len(value) > max_length:
        raise InvalidInput(
            f"{what} is {len(value)} characters long; at most {max_length} are allowed",
            code="invalid_name",
            param=what,
        )
    if "/" in value or "\\" in value or ".." in value or not _NAME.fullmatch(value):
        raise InvalidInput(
            f"{what} {value[:80]!r} is not allowed: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (no paths, no '..')",
            code="invalid_name",
            param=what,
        )
    return value


def check_label(value: object, what: str, max_length: int = 128) -> str:
    """A free-text label (an API key's name): printable, bounded."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-empty string", code="invalid_name", param=what)
    if len(value) > max_length or not value.isprintable():
        raise InvalidInput(
            f"{what} must be printable and at most {max_length} characters",
            code="invalid_name",
            param=what,
        )
    return value


def check_display_name(value: object, what: str, max_length: int = 128) -> str:
    """A name shown to people but never used in a path or key (a tenant's): printable text
    without surrounding spaces, slashes or '..'. Pages escape it; it may hold markup."""
    check_label(value, what, max_length)
    assert isinstance(value, str)
    if value != value.strip() or "/" in value or "\\" in value or ".." in value:
        raise InvalidInput(
            f"{what} {value[:80]!r} is not allowed: no surrounding spaces, slashes or '..'",
            code="invalid_name",
            param=what,
        )
    return value

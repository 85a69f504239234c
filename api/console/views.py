"""Rendering: one Jinja2 environment with autoescape on for every template, the page
context every template gets, and the console's security headers."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from loraplex.platform.services.operators import SignedIn

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
# Scripts only from our origin (no inline script, no eval); styles may be set by the chart
# library at run time; nothing is framed, nothing leaves for another origin.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
NAV = [
    ("overview", "Overview", "/console/"),
    ("tenants", "Tenants", "/console/tenants"),
    ("adapters", "Adapters", "/console/adapters"),
    ("deployments", "Models & deployments", "/console/deployments"),
    ("jobs", "Jobs", "/console/jobs"),
    ("requests", "Request lookup", "/console/requests"),
    ("audit", "Audit log", "/console/audit"),
    ("operators", "Operators", "/console/operators"),
]


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(value: int | None) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


ENV = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=True,  # every template, whatever its name: tenants supply names and errors
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["when"] = _when
ENV.filters["size"] = _size


def render(
    request: Request,
    template: str,
    *,
    status: int = 200,
    who: SignedIn | None = None,
    **context: Any,
) -> HTMLResponse:
    """A page (or an htmx fragment) with the common context and security headers."""
    page = ENV.get_template(template).render(
        request=request, who=who, nav=NAV, active=context.pop("active", ""), **context
    )
    return HTMLResponse(page, status_code=status, headers=SECURITY_HEADERS)

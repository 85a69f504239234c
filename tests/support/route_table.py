"""Every endpoint of an app, read from its route table (FastAPI may keep included routers
nested, each with its own prefix), so tests over "every route" cover a new route by default."""

from __future__ import annotations

from typing import Any

from fastapi.routing import APIRoute


def endpoints(routes: list[Any], prefix: str = "") -> list[tuple[str, set[str]]]:
    """(path, methods) of every endpoint under `routes` (an app's or a router's)."""
    out: list[tuple[str, set[str]]] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            out += endpoints(inner.routes, prefix + route.include_context.prefix)
        elif isinstance(route, APIRoute):
            out.append((prefix + route.path, set(route.methods)))
    return out

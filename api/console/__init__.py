"""The admin web console, served by the API process under `/console` (same origin):
server-rendered Jinja2 pages, htmx for live partial updates, uPlot for charts (both vendored
under `static/vendor/`, see VENDORED.md). `install_console(app)` adds it to an app."""

from __future__ import annotations

import inspect

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from loraplex.platform.errors import GENERIC_MESSAGE, LoraplexError

from . import (
    load_history,
    pages_auth,
    pages_catalog,
    pages_details,
    pages_operators,
    pages_ops,
    pages_overview,
    pages_requests,
    pages_tenants,
)
from .auth import SignInRequired
from .clean_input import refuse_control_characters
from .timing import ServerTiming
from .views import STATIC, render

PREFIX = "/console"


def _is_page(request: Request) -> bool:
    path = request.url.path
    return path.startswith(PREFIX) and not path.startswith(PREFIX + "/api/")


def install_console(app: FastAPI) -> None:
    """Mount the console's pages, its static files and its HTML error pages on `app`."""
    clean = [Depends(refuse_control_characters)]
    pages = (pages_auth, pages_overview, pages_tenants, pages_catalog, pages_details,
             pages_ops, pages_requests, pages_operators)  # fmt: skip
    for module in pages:
        app.include_router(
            module.router, prefix=PREFIX, include_in_schema=False, dependencies=clean
        )
    app.include_router(APIRouter(lifespan=load_history.sampling))  # deployments' load history
    app.mount(PREFIX + "/static", StaticFiles(directory=STATIC), name="console-static")
    json_handler = app.exception_handlers.get(LoraplexError)

    async def sign_in_first(request: Request, exc: SignInRequired) -> Response:
        if not _is_page(request) or request.headers.get("hx-request"):
            return Response(status_code=401, headers={"hx-redirect": PREFIX + "/sign-in"})
        return RedirectResponse(PREFIX + "/sign-in", status_code=303)

    async def console_error(request: Request, exc: LoraplexError) -> Response:
        if not _is_page(request) and json_handler is not None:
            answer = json_handler(request, exc)
            return await answer if inspect.isawaitable(answer) else answer
        message = exc.message if exc.status < 500 or exc.status == 501 else GENERIC_MESSAGE
        who = getattr(request.state, "operator", None)
        page = render(
            request,
            "error.html",
            status=exc.status,
            who=who,
            message=message,
            code=exc.code or "",
            title="Error",
        )
        page.headers.update(exc.headers)
        return page

    app.add_middleware(ServerTiming, prefix=PREFIX)
    app.add_exception_handler(SignInRequired, sign_in_first)  # type: ignore[arg-type]
    app.add_exception_handler(LoraplexError, console_error)  # type: ignore[arg-type]
    app.add_api_route(
        PREFIX, lambda: RedirectResponse(PREFIX + "/", status_code=307), include_in_schema=False
    )

"""The FastAPI application factory (`uvicorn --factory loraplex.api.app:create_app`)."""

from __future__ import annotations

import gc
from collections.abc import Callable

from fastapi import FastAPI

from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.graceful import DrainGuard
from loraplex.platform.http_errors import install_error_handlers
from loraplex.platform.jobs.celery_app import create_celery
from loraplex.platform.jobs.dispatch import CeleryDispatcher
from loraplex.platform.loop_watch import log_stalls
from loraplex.platform.services.auth_events import install_commit_hook
from loraplex.platform.settings import Settings

from .console import install_console
from .errors import BodyLimitMiddleware, ControlCharacterGuard, install_backend_down_handlers
from .openapi import install_openapi, operation_id
from .request_logging import RequestLogMiddleware, request_log_writer
from .route_warmup import warm_routes
from .routes import adapters, admin, draft_adapters, health, openai

JSON_BODY_LIMIT = 1 << 20
MULTIPART_OVERHEAD = 1 << 20


def body_limit(settings: Settings) -> Callable[[str, str], int | None]:
    """Per-route body limits, enforced as the bytes arrive (or by Content-Length up front):
    the adapter upload may carry both files, the completion routes `max_request_bytes`,
    every other route a small cap."""
    upload_limit = settings.max_adapter_bytes + settings.max_config_bytes + MULTIPART_OVERHEAD

    def limit_for(method: str, path: str) -> int | None:
        if method == "POST" and path.rstrip("/") == "/v1/adapters":
            return upload_limit
        if method == "POST" and path.startswith("/v1/adapters/") and path.endswith("/drafts"):
            return upload_limit  # a draft adapter's upload (routes/draft_adapters.py)
        if path.endswith("completions"):
            return settings.max_request_bytes
        return JSON_BODY_LIMIT  # every other route: small JSON or form bodies, or none

    return limit_for


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API for `settings` (from `LORAPLEX_*` env vars when None)."""
    settings = settings if settings is not None else Settings()
    app = FastAPI(
        title="loraplex",
        description="Multi-tenant LoRA hosting: admin and tenant adapter API.",
        version="0.1.0",
        generate_unique_id_function=operation_id,
    )
    app.state.settings = settings
    if settings.loop_stall_log_ms is not None:
        log_stalls(settings.loop_stall_log_ms)
    app.state.sessions = make_sessionmaker(settings.database_url) if settings.database_url else None
    if settings.gateway_redis_url():
        install_commit_hook(settings)  # revocations reach every gateway's key cache at once
    app.state.dispatcher = (
        CeleryDispatcher(create_celery(settings), settings.celery_queue)
        if settings.broker_url
        else None
    )
    app.add_middleware(BodyLimitMiddleware, limit_for=body_limit(settings))
    app.add_middleware(ControlCharacterGuard)
    app.add_middleware(DrainGuard)  # SIGTERM: new requests get 503 while streams finish
    install_error_handlers(app)  # after: request ids cover the body limit's answers too
    app.add_middleware(
        RequestLogMiddleware, writer=request_log_writer(settings, app.state.sessions)
    )
    install_backend_down_handlers(app)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(adapters.router)
    app.include_router(draft_adapters.router)
    app.include_router(openai.router)
    install_console(app)  # after the error handlers: its HTML pages wrap the JSON one
    install_openapi(app)
    warm_routes(app)  # before the freeze: the built state lives as long as the app
    # Everything loaded so far lives as long as the process: out of the collector's sight, a
    # full collection scans only what requests allocate (pauses that land on the event loop
    # shrink from ~100 ms to a few ms; see platform/loop_watch.py).
    gc.collect()
    gc.freeze()
    return app

"""Overview: each deployment's live replicas (their `/state`, asked with the replica secret)
and per-minute charts from the usage rows, refreshed without reloading."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse

from loraplex.platform.services import console_queries as cq
from loraplex.platform.services.operators import SignedIn

from .auth import current_operator
from .common import transaction
from .replicas import replica_views
from .views import SECURITY_HEADERS, render

router = APIRouter()


async def _deployments(request: Request) -> list[dict[str, Any]]:
    def load() -> list[dict[str, Any]]:
        with transaction(request) as session:
            deps, _ = cq.deployments_with_models(session)
            return [
                {
                    "id": str(d.id),
                    "name": d.name,
                    "base": d.base_model.name,
                    "weights": d.weight_quantization,
                    "kv": d.kv_cache_dtype,
                    "replicas": d.replicas,
                    "max_loras": d.max_loras,
                }
                for d in deps
            ]

    deps = await run_in_threadpool(load)
    gw = getattr(request.app.state, "gateway", None)
    for d in deps:
        d["live"] = await replica_views(request, d["name"])
        # Started but not ready yet (a cold start): requests wait for them, up to a bound.
        d["starting"] = await gw.registry.starting(d["name"]) if gw is not None else 0
    return deps


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, who: SignedIn = Depends(current_operator)) -> HTMLResponse:
    """The overview page."""
    deps = await _deployments(request)
    return render(
        request, "overview.html", who=who, active="overview", deployments=deps, title="Overview"
    )


@router.get("/partials/replicas", response_class=HTMLResponse)
async def replicas_partial(
    request: Request, who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """The replicas table alone (htmx polls it)."""
    deps = await _deployments(request)
    return render(request, "_replicas.html", who=who, deployments=deps)


@router.get("/api/usage-series")
def usage_series(
    request: Request, window: str = "hour", who: SignedIn = Depends(current_operator)
) -> JSONResponse:
    """The charts' data as JSON: per-minute request rate, output tok/s, TTFT p50/p95, ITL
    p95 and error rate over the last hour or day."""
    with transaction(request) as session:
        data = cq.usage_series(session, window)
    return JSONResponse(data, headers=SECURITY_HEADERS)

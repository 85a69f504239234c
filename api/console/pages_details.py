"""Detail pages: one adapter (versions with their validation report and their draft adapters,
delete a draft adapter, the replicas that hold it resident now, requests and tokens per day,
its own TTFT p50/p95) and one deployment (its replicas' live state and cold starts, its audit
trail of scale and option changes)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response

from loraplex.platform.services import console_details as cd
from loraplex.platform.services import draft_adapters
from loraplex.platform.services.operators import SignedIn

from ..deps import get_sessions, get_settings
from . import load_history
from .auth import current_operator, writer
from .common import back_to, parse_uuid, transaction
from .load_history import LoadHistory
from .pages_tenants import usage_chart
from .replicas import ReplicaView, replica_views
from .views import SECURITY_HEADERS, render

router = APIRouter()


@router.get("/adapters/{adapter_id}", response_class=HTMLResponse)
async def adapter_page(
    request: Request, adapter_id: str, who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """One adapter across its versions."""
    aid = parse_uuid(adapter_id, "adapter")

    def load() -> dict[str, Any]:
        with transaction(request) as session:
            data = cd.adapter_detail(session, aid)
            data["names"] = [d.name for d in data["deployments"]]
            return data

    data = await run_in_threadpool(load)
    live: dict[str, list[ReplicaView] | None] = {}
    for name in data["names"]:
        live[name] = await replica_views(request, name)
    keys = {r.key for r in data["versions"] if r.key}
    resident = [
        (name, view, sorted(keys & set(view.state.resident_adapters)))
        for name, views in live.items()
        for view in views or []
        if view.state is not None and keys & set(view.state.resident_adapters)
    ]
    a = data["adapter"]
    by_day = [{"day": u["day"], "model": label, "requests": u[key]}
              for u in data["usage"] for label, key in (("requests", "requests"), ("failed", "errors"))]  # fmt: skip
    data["chart"] = usage_chart(by_day)
    return await run_in_threadpool(
        lambda: render(
            request,
            "adapter.html",
            who=who,
            active="adapters",
            data=data,
            resident=resident,
            gateway=getattr(request.app.state, "gateway", None),
            crumbs=[
                ("Adapters", "/console/adapters"),
                (data["tenant"].name, f"/console/tenants/{a.tenant_id}"),
            ],
            msg=request.query_params.get("msg", ""),
            title=f"Adapter {a.name}",
        )  # fmt: skip
    )


@router.post("/adapters/{adapter_id}/drafts/{draft_id}/delete")
def draft_delete(
    request: Request, adapter_id: str, draft_id: str, who: SignedIn = Depends(writer)
) -> Response:
    """Delete one of the adapter's draft adapters: untied from now on, its objects then its
    row removed (kept `deleting` for the reconciler when storage fails: 503)."""
    aid = parse_uuid(adapter_id, "adapter")
    did = parse_uuid(draft_id, "draft_adapter")
    with transaction(request, who) as session:
        row = draft_adapters.mark_draft_deleting(session, aid, did, actor=who.actor)
    draft_adapters.finish_draft_delete(get_settings(request), get_sessions(request), row)
    return back_to(f"/console/adapters/{aid}", msg="Draft adapter deleted.")


def _deployment(request: Request, did: uuid.UUID) -> dict[str, Any]:
    """One deployment's detail (a worker thread's job: it queries the database)."""
    with transaction(request) as session:
        data = cd.deployment_detail(session, did)
        data["name"] = data["deployment"].name
        return data


@router.get("/deployments/{deployment_id}", response_class=HTMLResponse)
async def deployment_page(
    request: Request, deployment_id: str, who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """One deployment: its replicas now and its history of changes."""
    did = parse_uuid(deployment_id, "deployment")

    data = await run_in_threadpool(_deployment, request, did)
    gw = getattr(request.app.state, "gateway", None)
    live = await replica_views(request, data["name"])
    starting = await gw.registry.starting(data["name"]) if gw is not None else 0
    return await run_in_threadpool(
        lambda: render(
            request,
            "deployment.html",
            who=who,
            active="deployments",
            data=data,
            live=live,
            starting=starting,
            every_s=load_history.SAMPLE_EVERY_S,
            keep_hours=f"{load_history.SAMPLE_EVERY_S * load_history.KEEP / 3600:g}",
            crumbs=[("Models & deployments", "/console/deployments")],
            title=f"Deployment {data['name']}",
        )  # fmt: skip
    )


@router.get("/deployments/{deployment_id}/replicas-now", response_class=HTMLResponse)
async def deployment_replicas_partial(
    request: Request, deployment_id: str, who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """The deployment's replicas table alone (htmx polls it)."""
    did = parse_uuid(deployment_id, "deployment")

    data = await run_in_threadpool(_deployment, request, did)
    live = await replica_views(request, data["name"])
    return await run_in_threadpool(
        lambda: render(
            request,
            "_deployment_replicas.html",
            who=who,
            data=data,
            live=live,
            d=data["deployment"],
        )  # fmt: skip
    )


@router.get("/api/deployments/{deployment_id}/load")
async def deployment_load_json(
    request: Request, deployment_id: str, who: SignedIn = Depends(current_operator)
) -> JSONResponse:
    """The deployment's load over time as the API sampled it (`load_history.py`): KV use of
    the busiest replica, queued and running requests, resident adapters and live replicas."""
    did = parse_uuid(deployment_id, "deployment")
    name = (await run_in_threadpool(_deployment, request, did))["name"]
    history = getattr(request.app.state, "load_history", None)
    series = history.series(name) if history is not None else LoadHistory().series(name)
    body = {"every_s": load_history.SAMPLE_EVERY_S, "units": load_history.UNITS, "series": series}
    return JSONResponse(body, headers=SECURITY_HEADERS)

"""Adapters across tenants (filters, versions, delete a version) and base models and
deployments (register from an S3 prefix, create, change the replica count, see the live
replicas and each one's cold-start timeline)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, Response

from loraplex.platform.db.models import KV_CACHE_DTYPES, VERSION_STATUSES, WEIGHT_QUANTIZATIONS
from loraplex.platform.errors import HttpError
from loraplex.platform.services import admin_actions, base_models, deployments
from loraplex.platform.services import console_queries as cq
from loraplex.platform.services.console_paging import parse_sort
from loraplex.platform.services.operators import SignedIn

from ..deps import get_settings
from .auth import current_operator, writer
from .common import back_to, optional_int, page_arg, parse_uuid, transaction
from .replicas import replica_views
from .views import render

router = APIRouter()


@router.get("/adapters", response_class=HTMLResponse)
def adapters_list(
    request: Request,
    status: str = "",
    base_model: str = "",
    tenant: str = "",
    page: str = "1",
    sort: str = "",
    order: str = Query("", alias="dir"),
    who: SignedIn = Depends(current_operator),
) -> HTMLResponse:
    """Adapter versions across tenants, filtered by status, base model and tenant name, sorted
    (newest first unless asked) in the database."""
    status = status if status in VERSION_STATUSES else ""
    order_by = parse_sort("adapters", sort, order)
    with transaction(request) as session:
        result = cq.adapters_page(
            session, status, base_model[:128], tenant[:128], page_arg(page), order_by
        )
        _, models = cq.deployments_with_models(session)
        return render(
            request,
            "adapters.html",
            who=who,
            active="adapters",
            result=result,
            statuses=VERSION_STATUSES,
            models=[m.name for m in models],
            f={"status": status, "base_model": base_model, "tenant": tenant},
            msg=request.query_params.get("msg", ""),
            title="Adapters",
        )


@router.post("/adapters/versions/{version_id}/delete")
async def version_delete(
    request: Request, version_id: str, who: SignedIn = Depends(writer)
) -> Response:
    """Delete one adapter version: not served from now on, its objects then its row removed."""
    vid = parse_uuid(version_id, "version")
    with transaction(request, who) as session:
        tenant_id, prefix, adapter_id = admin_actions.mark_version_deleting(
            session, vid, actor=who.actor
        )
    with transaction(request, who) as session:
        admin_actions.finish_version_delete(
            get_settings(request), session, vid, tenant_id, prefix, adapter_id
        )
    return back_to("/console/adapters", msg="Version deleted.")


@router.get("/deployments", response_class=HTMLResponse)
async def deployments_page(
    request: Request, who: SignedIn = Depends(current_operator)
) -> HTMLResponse:
    """Base models and deployments, with each deployment's live replicas and cold starts."""

    def names() -> list[str]:
        with transaction(request) as session:
            return [d.name for d in cq.deployments_with_models(session)[0]]

    live = {name: await replica_views(request, name) for name in await run_in_threadpool(names)}

    def page() -> HTMLResponse:
        with transaction(request) as session:
            deps, models = cq.deployments_with_models(session)
            return render(
                request,
                "deployments.html",
                who=who,
                active="deployments",
                deployments=deps,
                live=live,
                models=models,
                quantizations=WEIGHT_QUANTIZATIONS,
                kv_dtypes=KV_CACHE_DTYPES,
                msg=request.query_params.get("msg", ""),
                title="Models & deployments",
            )

    return await run_in_threadpool(page)


@router.post("/base-models")
async def base_model_register(
    request: Request,
    name: str = Form(""),
    object_prefix: str = Form(""),
    who: SignedIn = Depends(writer),
) -> Response:
    """Register a base model whose files are in the bucket under `object_prefix`."""
    with transaction(request, who) as session:
        base_models.register_from_prefix(
            session, get_settings(request), name, object_prefix, actor=who.actor
        )
    return back_to("/console/deployments", msg=f"Registered {name}.")


@router.post("/deployments")
async def deployment_create(
    request: Request,
    name: str = Form(""),
    base_model: str = Form(""),
    weights: str = Form("bf16"),
    kv_cache: str = Form("auto"),
    max_loras: str = Form(""),
    max_lora_rank: str = Form(""),
    replicas: str = Form("1"),
    who: SignedIn = Depends(writer),
) -> Response:
    """Create a deployment of a registered base model."""
    spec = deployments.DeploymentSpec(
        name=name,
        base_model=base_model,
        weight_quantization=weights,
        kv_cache_dtype=kv_cache,
        max_loras=optional_int(max_loras, "max_loras"),
        max_lora_rank=optional_int(max_lora_rank, "max_lora_rank"),
        replicas=optional_int(replicas, "replicas") or 0,
    )
    with transaction(request, who) as session:
        deployments.create_deployment(session, get_settings(request), spec, actor=who.actor)
    return back_to("/console/deployments", msg=f"Created {name}.")


@router.post("/deployments/{deployment_id}/replicas")
async def deployment_scale(
    request: Request, deployment_id: str, replicas: str = Form(""), who: SignedIn = Depends(writer)
) -> Response:
    """Change a deployment's replica count (through `deployments.set_replicas`)."""
    dep_id = parse_uuid(deployment_id, "deployment")
    count = optional_int(replicas, "replicas")
    set_replicas = getattr(deployments, "set_replicas", None)
    if set_replicas is None:
        raise HttpError(
            501,
            "Changing replicas needs deployments.set_replicas (the admin PATCH route's "
            "service), which this build does not have yet.",
            code="not_implemented",
        )
    with transaction(request, who) as session:
        dep = set_replicas(session, dep_id, count, actor=who.actor)  # audited there
        name = dep.name
    return back_to("/console/deployments", msg=f"{name}: {count} replica(s).")

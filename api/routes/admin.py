"""Admin API (Bearer admin key): tenants, their API keys, deployments, base models."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from loraplex.platform.db.models import Deployment
from loraplex.platform.db.session import session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.services import api_keys, base_models, deployments, tenants
from loraplex.platform.services.errors import InvalidInput, NotFound
from loraplex.platform.settings import Settings

from .. import idempotent
from ..deps import get_db, get_sessions, get_settings, require_admin
from ..response_models import (
    ApiKeyCreated,
    ApiKeyList,
    ApiKeyOut,
    BaseModelList,
    DeploymentList,
    DeploymentOut,
    DeploymentReplicasOut,
    TenantList,
    TenantOut,
)
from ..schemas import (
    ApiKeyCreate,
    BaseModelRegister,
    DeploymentCreate,
    DeploymentPatch,
    TenantCreate,
    TenantUpdate,
    api_key_view,
    base_model_view,
    deployment_view,
    tenant_view,
)

router = APIRouter(prefix="/admin/v1", tags=["admin"], dependencies=[Depends(require_admin)])


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(f"no {what} with id {value[:64]!r}", code=f"{what}_not_found") from None


def _listing(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": items}


@router.post("/tenants", status_code=201, response_model=TenantOut)
async def create_tenant(
    body: TenantCreate,
    request: Request,
    sessions: sessionmaker[Session] = Depends(get_sessions),
    actor: str = Depends(require_admin),
) -> JSONResponse:
    """Create a tenant."""

    def handler() -> dict[str, Any]:
        with session_scope(sessions) as session:
            tenant = tenants.create_tenant(session, body.name, limits=body.limits(), actor=actor)
            return tenant_view(tenant)

    return await idempotent.respond(
        request,
        sessions,
        scope=idempotent.ADMIN_SCOPE,
        tenant_id=None,
        fingerprint_parts=(body.model_dump(),),
        status=201,
        handler=handler,
    )


@router.get("/tenants", response_model=TenantList)
def list_tenants(session: Session = Depends(get_db)) -> dict[str, Any]:
    """Every tenant."""
    return _listing([tenant_view(t) for t in tenants.list_tenants(session)])


@router.get("/tenants/{tenant_id}", response_model=TenantOut)
def get_tenant(tenant_id: str, session: Session = Depends(get_db)) -> dict[str, Any]:
    """One tenant."""
    return tenant_view(tenants.get_tenant(session, _uuid(tenant_id, "tenant")))


@router.patch("/tenants/{tenant_id}", response_model=TenantOut)
def update_tenant(
    tenant_id: str,
    body: TenantUpdate,
    session: Session = Depends(get_db),
    actor: str = Depends(require_admin),
) -> dict[str, Any]:
    """Change a tenant's rate limits or monthly token quota (null: back to the default).
    The gateway applies them from the tenant's next request."""
    tid = _uuid(tenant_id, "tenant")
    changes = body.limits(only_sent=True)
    return tenant_view(tenants.update_limits(session, tid, changes, actor=actor))


@router.post("/tenants/{tenant_id}/api-keys", status_code=201, response_model=ApiKeyCreated)
async def create_api_key(
    tenant_id: str,
    body: ApiKeyCreate,
    request: Request,
    sessions: sessionmaker[Session] = Depends(get_sessions),
    actor: str = Depends(require_admin),
) -> JSONResponse:
    """Create an API key; the response is the only time the plain `key` is shown."""
    tid = _uuid(tenant_id, "tenant")

    def handler() -> dict[str, Any]:
        with session_scope(sessions) as session:
            key, plain = api_keys.create_api_key(session, tid, body.name, body.scopes, actor=actor)
            return api_key_view(key, plain)

    def redact(view: dict[str, Any]) -> dict[str, Any]:
        return {**view, "key": None}  # never store the secret: a replay shows the key once only

    return await idempotent.respond(
        request,
        sessions,
        scope=idempotent.ADMIN_SCOPE,
        tenant_id=None,
        fingerprint_parts=(body.model_dump(),),
        status=201,
        handler=handler,
        redact=redact,
    )


@router.get("/tenants/{tenant_id}/api-keys", response_model=ApiKeyList)
def list_api_keys(tenant_id: str, session: Session = Depends(get_db)) -> dict[str, Any]:
    """A tenant's keys (no secrets)."""
    tid = _uuid(tenant_id, "tenant")
    tenants.get_tenant(session, tid)
    return _listing([api_key_view(k) for k in api_keys.list_api_keys(session, tid)])


@router.delete("/api-keys/{key_id}", response_model=ApiKeyOut)
def revoke_api_key(
    key_id: str, session: Session = Depends(get_db), actor: str = Depends(require_admin)
) -> dict[str, Any]:
    """Revoke a key: requests with it get 401 from now on."""
    return api_key_view(api_keys.revoke_api_key(session, _uuid(key_id, "api_key"), actor=actor))


@router.post("/deployments", status_code=201, response_model=DeploymentOut)
async def create_deployment(
    body: DeploymentCreate,
    request: Request,
    sessions: sessionmaker[Session] = Depends(get_sessions),
    settings: Settings = Depends(get_settings),
    actor: str = Depends(require_admin),
) -> JSONResponse:
    """Create a deployment of a registered base model."""
    spec = deployments.DeploymentSpec(
        name=body.name,
        base_model=body.base_model,
        weight_quantization=body.quantization.weights,
        kv_cache_dtype=body.quantization.kv_cache,
        max_loras=body.max_loras,
        max_lora_rank=body.max_lora_rank,
        replicas=body.replicas,
        expert_parallel_size=body.expert_parallel_size,
        share_prefix_cache=body.share_prefix_cache,
        cold_start_wait_s=body.cold_start_wait_s,
        deterministic=body.deterministic,
        routing_weight=body.routing_weight,
        nameable=body.nameable,
        tool_call_format=body.tool_call_format,
        speculative=body.speculative,
    )

    def handler() -> dict[str, Any]:
        with session_scope(sessions) as session:
            return deployment_view(
                deployments.create_deployment(session, settings, spec, actor=actor)
            )

    return await idempotent.respond(
        request,
        sessions,
        scope=idempotent.ADMIN_SCOPE,
        tenant_id=None,
        fingerprint_parts=(body.model_dump(),),
        status=201,
        handler=handler,
    )


@router.get("/deployments", response_model=DeploymentList)
def list_deployments(session: Session = Depends(get_db)) -> dict[str, Any]:
    """Every deployment."""
    return _listing([deployment_view(d) for d in deployments.list_deployments(session)])


@router.patch("/deployments/{deployment_id}", response_model=DeploymentOut)
def patch_deployment(
    deployment_id: str,
    body: DeploymentPatch,
    session: Session = Depends(get_db),
    actor: str = Depends(require_admin),
) -> dict[str, Any]:
    """Change a deployment's replica count (0 stops serving it), its routing weight among
    the deployments of its base model, whether requests may name it, or its tool-call format
    (null: from the chat template)."""
    did = _uuid(deployment_id, "deployment")
    given = body.model_fields_set
    if not given:
        raise InvalidInput(
            "nothing to change: give replicas, routing_weight, nameable or tool_call_format",
            code="invalid_value",
        )
    for field in ("replicas", "nameable"):
        if field in given and getattr(body, field) is None:
            raise InvalidInput(f"{field} cannot be null", code="invalid_value", param=field)
    dep = None
    if body.replicas is not None:
        dep = deployments.set_replicas(session, did, body.replicas, actor=actor)
    if "routing_weight" in given or "nameable" in given:
        routing: dict[str, Any] = {"nameable": body.nameable}
        if "routing_weight" in given:
            routing["routing_weight"] = body.routing_weight
        dep = deployments.set_routing(session, did, actor=actor, **routing)
    if "tool_call_format" in given:
        dep = deployments.set_tool_call_format(session, did, body.tool_call_format, actor=actor)
    assert dep is not None
    return deployment_view(dep)


@router.get("/deployments/{deployment_id}/replicas", response_model=DeploymentReplicasOut)
async def deployment_replicas(
    deployment_id: str, request: Request, sessions: sessionmaker[Session] = Depends(get_sessions)
) -> dict[str, Any]:
    """The deployment's replicas as the gateway sees them: how many are ready, how many are
    still starting (cold start), against the `replicas` its row asks for."""
    dep_id = _uuid(deployment_id, "deployment")

    def load() -> tuple[str, int]:
        with sessions() as session:
            row = session.get(Deployment, dep_id)
            if row is None:
                raise NotFound(
                    f"no deployment with id {deployment_id!r}", code="deployment_not_found"
                )
            return row.name, row.replicas

    name, desired = await run_in_threadpool(load)
    gw = getattr(request.app.state, "gateway", None)
    if gw is None:
        raise HttpError(503, "The inference gateway is not configured.", type="service_unavailable",
                        code="gateway_unavailable")  # fmt: skip
    ready = await gw.registry.live(name)
    return {"object": "deployment.replicas", "deployment": name, "desired": desired,
            "ready": len(ready), "starting": await gw.registry.starting(name)}  # fmt: skip


@router.post("/base-models", status_code=201)
def register_base_model(
    body: BaseModelRegister,
    session: Session = Depends(get_db),
    settings: Settings = Depends(get_settings),
    actor: str = Depends(require_admin),
) -> dict[str, Any]:
    """Register a base model whose files are already in the bucket under `object_prefix`
    (a folder under `models/` with config.json and safetensors weights)."""
    model = base_models.register_from_prefix(
        session, settings, body.name, body.object_prefix, actor=actor
    )
    return base_model_view(model)


@router.get("/base-models", response_model=BaseModelList)
def list_base_models(session: Session = Depends(get_db)) -> dict[str, Any]:
    """Every registered base model."""
    return _listing([base_model_view(m) for m in base_models.list_base_models(session)])

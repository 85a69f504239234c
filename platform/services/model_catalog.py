"""The models a tenant can call, as OpenAI model objects: every base model, and the tenant's
adapters that have a ready version (`GET /v1/models`). Each object lists the deployments that
serve it with their quantization (weights and KV cache), so a caller sees what it runs on."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import Adapter, AdapterVersion, BaseModel, Deployment


def model_object(
    model_id: str,
    created: int,
    owned_by: str,
    parent: str | None,
    root: str | None = None,
    deployments: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One OpenAI model object (`parent` is the base model of an adapter, else None), with
    the deployments serving it when known."""
    obj: dict[str, Any] = {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": owned_by,
        "root": root or parent or model_id,
        "parent": parent,
    }
    if deployments is not None:
        obj["deployments"] = deployments
    return obj


def deployment_entry(d: Any) -> dict[str, Any]:
    """What a caller sees of one deployment: name, quantization, its serving options."""
    return {
        "name": d.name,
        "quantization": {"weights": d.weight_quantization, "kv_cache": d.kv_cache_dtype},
        "deterministic": bool(d.deterministic),
        "speculative": getattr(d, "speculative", None),
    }


def deployments_by_base(session: Session) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """Each base model's deployments: name and quantization (weights, kv_cache)."""
    out: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for d in session.execute(select(Deployment).order_by(Deployment.name)).scalars().all():
        out.setdefault(d.base_model_id, []).append(deployment_entry(d))
    return out


def list_models(sessions: sessionmaker[Session], tenant_id: uuid.UUID) -> list[dict[str, Any]]:
    """Deployed base models, then the tenant's adapters with a ready version on them (call off
    the event loop)."""
    with sessions() as session:
        bases = session.execute(select(BaseModel).order_by(BaseModel.name)).scalars().all()
        deps = deployments_by_base(session)
        # Only what a deployment serves: anything else answers 404 when called.
        out = [
            model_object(
                b.name, int(b.created_at.timestamp()), "loraplex", None,
                deployments=deps[b.id],
            )
            for b in bases
            if b.id in deps
        ]  # fmt: skip
        ready = (
            select(Adapter)
            .where(Adapter.tenant_id == tenant_id)
            .where(
                select(AdapterVersion.id)
                .where(AdapterVersion.adapter_id == Adapter.id, AdapterVersion.status == "ready")
                .exists()
            )
            .order_by(Adapter.name)
        )
        for a in session.execute(ready).scalars().all():
            if a.base_model_id not in deps:
                continue
            created = int(a.created_at.timestamp())
            out.append(
                model_object(
                    a.name, created, str(tenant_id), a.base_model.name,
                    deployments=deps.get(a.base_model_id, []),
                )
            )  # fmt: skip
        return out

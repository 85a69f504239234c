"""Deployments: how a base model is served (quantization, LoRA slots, replicas, EP size)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from loraplex.platform.db.models import (
    KV_CACHE_DTYPES,
    TOOL_CALL_FORMATS,
    WEIGHT_QUANTIZATIONS,
    Deployment,
)
from loraplex.platform.engine_spec.config import deterministic_gap
from loraplex.platform.engine_spec.deployment import DEPLOYMENT_DEFAULTS
from loraplex.platform.engine_spec.quantization import QuantizationRefused, check_quantization
from loraplex.platform.engine_spec.speculative import parse_speculative, speculative_gap
from loraplex.platform.engine_spec.supported_models import (
    SERVED_KV_CACHE_DTYPES,
    SERVED_WEIGHT_QUANTIZATIONS,
    unserved_kv_cache_message,
    unserved_quantization_message,
)
from loraplex.platform.settings import Settings

from . import audit
from .base_models import get_base_model
from .errors import Conflict, InvalidInput, NotFound
from .names import check_name

MAX_DEPLOYMENT_NAME = 128
MAX_LORA_RANK_LIMIT = 1024
MAX_LORAS_LIMIT = 4096
MAX_REPLICAS = 1024


@dataclass(frozen=True)
class DeploymentSpec:
    """What an admin asks for when creating a deployment."""

    name: str
    base_model: str
    weight_quantization: str = DEPLOYMENT_DEFAULTS.weight_quantization
    kv_cache_dtype: str = DEPLOYMENT_DEFAULTS.kv_cache_dtype
    max_loras: int | None = None
    max_lora_rank: int | None = None
    replicas: int = DEPLOYMENT_DEFAULTS.replicas
    expert_parallel_size: int = DEPLOYMENT_DEFAULTS.expert_parallel_size
    share_prefix_cache: bool = DEPLOYMENT_DEFAULTS.share_prefix_cache
    cold_start_wait_s: float = DEPLOYMENT_DEFAULTS.cold_start_wait_s
    deterministic: bool = DEPLOYMENT_DEFAULTS.deterministic
    routing_weight: float | None = None  # share of its base model's traffic; None: by capacity
    nameable: bool = DEPLOYMENT_DEFAULTS.nameable  # requests may pick it (X-Loraplex-Deployment)
    tool_call_format: str | None = None  # how tool calls are read in free output; None: template
    speculative: dict[str, Any] | None = None  # engine_spec.speculative's option; None: off


def _check_range(value: int, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(
            f"{what} must be an integer in {low}..{high}, got {value!r}",
            code="invalid_value",
            param=what,
        )
    return value


def _check_weight(weight: float | None) -> float | None:
    """A routing weight: None (route by capacity) or a number in 0..1000 (0: takes routed
    traffic only while no weighted deployment of its base model has a live replica)."""
    if weight is None:
        return None
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1000:
        raise InvalidInput(
            f"routing_weight must be null or a number in 0..1000, got {weight!r}",
            code="invalid_value",
            param="routing_weight",
        )
    return float(weight)


def _check_tool_format(fmt: str | None) -> str | None:
    """A tool-call format: None (read from the chat template) or one the gateway parses."""
    if fmt is not None and fmt not in TOOL_CALL_FORMATS:
        raise InvalidInput(
            f"tool_call_format must be null (from the chat template) or one of "
            f"{list(TOOL_CALL_FORMATS)}, got {fmt!r}",
            code="invalid_value",
            param="tool_call_format",
        )
    return fmt


def _check_speculative(spec: dict[str, Any] | None, ep_size: int) -> dict[str, Any] | None:
    """A speculative option as stored (defaults filled), or None; 400 naming what the engine
    would refuse (a method not built, K bounds, expert parallelism)."""
    if spec is None:
        return None
    try:
        option = parse_speculative(spec)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(str(exc), code="invalid_value", param="speculative") from exc
    gap = speculative_gap(option, ep_size)
    if gap is not None:
        raise InvalidInput(
            f"speculative decoding does not serve {gap}",
            code="unsupported_option",
            param="speculative",
        )
    return option.to_dict()


def create_deployment(
    session: Session, settings: Settings, spec: DeploymentSpec, *, actor: str = audit.ADMIN_ACTOR
) -> Deployment:
    """Validate the spec against the base model and store it (Conflict on a taken name)."""
    check_name(spec.name, "name", MAX_DEPLOYMENT_NAME)
    if spec.weight_quantization not in WEIGHT_QUANTIZATIONS:
        raise InvalidInput(
            f"quantization.weights must be one of {list(WEIGHT_QUANTIZATIONS)}",
            code="invalid_value",
            param="quantization.weights",
        )
    if spec.weight_quantization not in SERVED_WEIGHT_QUANTIZATIONS:
        raise InvalidInput(
            unserved_quantization_message(spec.weight_quantization),
            code="unsupported_quantization",
            param="quantization.weights",
        )
    if spec.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InvalidInput(
            f"quantization.kv_cache must be one of {list(KV_CACHE_DTYPES)}",
            code="invalid_value",
            param="quantization.kv_cache",
        )
    if spec.kv_cache_dtype not in SERVED_KV_CACHE_DTYPES:
        raise InvalidInput(
            unserved_kv_cache_message(spec.kv_cache_dtype),
            code="unsupported_quantization",
            param="quantization.kv_cache",
        )
    max_loras = _check_range(
        spec.max_loras or settings.default_max_loras, "max_loras", 1, MAX_LORAS_LIMIT
    )
    max_rank = _check_range(
        spec.max_lora_rank or settings.default_max_lora_rank,
        "max_lora_rank",
        1,
        MAX_LORA_RANK_LIMIT,
    )
    replicas = _check_range(spec.replicas, "replicas", 0, MAX_REPLICAS)
    ep = _check_range(spec.expert_parallel_size, "expert_parallel_size", 1, 1024)
    speculative = _check_speculative(spec.speculative, ep)
    base = get_base_model(session, spec.base_model)
    try:
        check_quantization(spec.weight_quantization, spec.kv_cache_dtype, dict(base.config or {}))
    except QuantizationRefused as exc:
        raise InvalidInput(
            str(exc), code="unsupported_quantization", param="quantization.weights"
        ) from exc
    if ep > 1 and base.family != "moe":
        raise InvalidInput(
            f"expert_parallel_size > 1 needs a mixture-of-experts base model; "
            f"{base.name!r} is {base.family}",
            code="invalid_value",
            param="expert_parallel_size",
        )
    if spec.deterministic:
        # The device is the launcher's to check (engine_config_for_deployment refuses a GPU).
        why = deterministic_gap(spec.weight_quantization, spec.kv_cache_dtype, ep)
        if why is not None:
            raise InvalidInput(
                f"the deterministic mode does not cover {why} yet",
                code="unsupported_option",
                param="deterministic",
            )
    wait = spec.cold_start_wait_s
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 3600:
        raise InvalidInput(
            f"cold_start_wait_s must be a number of seconds in 0..3600, got {wait!r}",
            code="invalid_value",
            param="cold_start_wait_s",
        )
    weight = _check_weight(spec.routing_weight)
    tool_format = _check_tool_format(spec.tool_call_format)
    stmt = (
        insert(Deployment)
        .values(
            id=uuid.uuid4(),
            name=spec.name,
            base_model_id=base.id,
            weight_quantization=spec.weight_quantization,
            kv_cache_dtype=spec.kv_cache_dtype,
            max_loras=max_loras,
            max_lora_rank=max_rank,
            replicas=replicas,
            expert_parallel_size=ep,
            share_prefix_cache=bool(spec.share_prefix_cache),
            cold_start_wait_s=float(spec.cold_start_wait_s),
            deterministic=bool(spec.deterministic),
            routing_weight=weight,
            nameable=bool(spec.nameable),
            tool_call_format=tool_format,
            speculative=speculative,
        )
        .on_conflict_do_nothing()
        .returning(Deployment.id)
    )
    dep_id = session.execute(stmt).scalar_one_or_none()
    if dep_id is None:
        raise Conflict(
            f"a deployment named {spec.name!r} exists already",
            code="deployment_exists",
            param="name",
        )
    dep = session.get(Deployment, dep_id)
    assert dep is not None
    audit.record(
        session,
        actor=actor,
        action="deployment.create",
        resource_type="deployment",
        resource_id=dep.id,
        detail={"name": spec.name, "base_model": base.name},
    )
    return dep


def list_deployments(session: Session) -> list[Deployment]:
    """Every deployment."""
    return list(session.scalars(select(Deployment).order_by(Deployment.created_at)))


def set_replicas(
    session: Session,
    deployment_id: uuid.UUID,
    replicas: int,
    *,
    actor: str = audit.ADMIN_ACTOR,
) -> Deployment:
    """Change how many replicas a deployment should run (0 stops it); the supervisor and
    `loraplex up` read the count, so scaling is one audited row update."""
    count = _check_range(replicas, "replicas", 0, MAX_REPLICAS)
    locked = select(Deployment).where(Deployment.id == deployment_id)
    dep = session.scalars(locked.with_for_update(of=Deployment)).one_or_none()
    if dep is None:
        raise NotFound(f"no deployment with id {deployment_id}", code="deployment_not_found")
    before = dep.replicas
    dep.replicas = count
    session.flush()
    audit.record(
        session,
        actor=actor,
        action="deployment.scale",
        resource_type="deployment",
        resource_id=dep.id,
        detail={"name": dep.name, "replicas_before": before, "replicas": count},
    )
    return dep


_UNCHANGED: Any = object()


def set_routing(
    session: Session,
    deployment_id: uuid.UUID,
    *,
    routing_weight: float | None = _UNCHANGED,
    nameable: bool | None = None,
    actor: str = audit.ADMIN_ACTOR,
) -> Deployment:
    """Change how the gateway routes to a deployment: its weight among the deployments of its
    base model (None: by capacity) and whether requests may name it; one audited update."""
    locked = select(Deployment).where(Deployment.id == deployment_id)
    dep = session.scalars(locked.with_for_update(of=Deployment)).one_or_none()
    if dep is None:
        raise NotFound(f"no deployment with id {deployment_id}", code="deployment_not_found")
    before = {"routing_weight": dep.routing_weight, "nameable": dep.nameable}
    if routing_weight is not _UNCHANGED:
        dep.routing_weight = _check_weight(routing_weight)
    if nameable is not None:
        dep.nameable = bool(nameable)
    session.flush()
    audit.record(
        session,
        actor=actor,
        action="deployment.routing",
        resource_type="deployment",
        resource_id=dep.id,
        detail={
            "name": dep.name,
            "before": before,
            "routing_weight": dep.routing_weight,
            "nameable": dep.nameable,
        },
    )
    return dep


def set_tool_call_format(
    session: Session,
    deployment_id: uuid.UUID,
    tool_call_format: str | None,
    *,
    actor: str = audit.ADMIN_ACTOR,
) -> Deployment:
    """Change how the gateway reads tool calls in this deployment's free output (None: from
    the chat template); one audited update, seen by gateways within their resolve TTL."""
    fmt = _check_tool_format(tool_call_format)
    locked = select(Deployment).where(Deployment.id == deployment_id)
    dep = session.scalars(locked.with_for_update(of=Deployment)).one_or_none()
    if dep is None:
        raise NotFound(f"no deployment with id {deployment_id}", code="deployment_not_found")
    before, dep.tool_call_format = dep.tool_call_format, fmt
    session.flush()
    audit.record(
        session,
        actor=actor,
        action="deployment.tool_call_format",
        resource_type="deployment",
        resource_id=dep.id,
        detail={"name": dep.name, "before": before, "tool_call_format": fmt},
    )
    return dep


def max_lora_rank_for(session: Session, settings: Settings, base_model_id: uuid.UUID) -> int:
    """The rank limit an adapter over this base model must meet.

    The smallest `max_lora_rank` of the base model's deployments, so a ready adapter fits every
    deployment that may serve it; `Settings.default_max_lora_rank` when there is none.
    """
    stmt = select(func.min(Deployment.max_lora_rank)).where(
        Deployment.base_model_id == base_model_id
    )
    limit = session.execute(stmt).scalar_one_or_none()
    return int(limit) if limit is not None else settings.default_max_lora_rank

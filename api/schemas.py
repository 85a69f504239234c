"""Request bodies (pydantic, strict about unknown fields) and response views (plain dicts)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, WithJsonSchema
from pydantic.json_schema import JsonDict

from loraplex.platform.db.models import (
    Adapter,
    AdapterVersion,
    ApiKey,
    Deployment,
    Tenant,
)
from loraplex.platform.db.models import BaseModel as BaseModelRow
from loraplex.platform.engine_spec.deployment import DEPLOYMENT_DEFAULTS
from loraplex.platform.engine_spec.quantization import KV_CACHE_CHOICES, WEIGHT_CHOICES
from loraplex.platform.services.tenants import LIMIT_RANGES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Documented in the OpenAPI (the services check them, answering 400 with the field's name).
NAME_PATTERN: JsonDict = {"pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*$"}


def _limit(field: str) -> Any:
    low, high = LIMIT_RANGES[field]
    return Field(default=None, json_schema_extra={"minimum": low, "maximum": high})


class TenantLimitsFields(_Strict):
    """A tenant's own limits (null: the deployment default); ranges are checked by the
    tenants service (400 naming the field)."""

    requests_per_minute: StrictInt | None = _limit("requests_per_minute")
    tokens_per_minute: StrictInt | None = _limit("tokens_per_minute")
    monthly_token_quota: StrictInt | None = _limit("monthly_token_quota")
    max_concurrent_uploads: StrictInt | None = _limit("max_concurrent_uploads")
    max_stored_adapter_bytes: StrictInt | None = _limit("max_stored_adapter_bytes")

    def limits(self, only_sent: bool = False) -> dict[str, int | None]:
        """The limit fields (only those the body named when `only_sent`)."""
        names = TenantLimitsFields.model_fields
        sent = self.model_fields_set if only_sent else names
        return {k: getattr(self, k) for k in names if k in sent}


class TenantCreate(TenantLimitsFields):
    """`POST /admin/v1/tenants`."""

    name: str = Field(min_length=1, max_length=128, json_schema_extra=NAME_PATTERN)


class TenantUpdate(TenantLimitsFields):
    """`PATCH /admin/v1/tenants/{id}`: the limits to change (null resets one to the default)."""


class BaseModelRegister(_Strict):
    """`POST /admin/v1/base-models`: a model already in the bucket under `object_prefix`."""

    name: str = Field(min_length=1, max_length=128)
    object_prefix: str = Field(min_length=1, max_length=512)


class ApiKeyCreate(_Strict):
    """`POST /admin/v1/tenants/{id}/api-keys`."""

    name: str = Field(min_length=1, max_length=128)
    scopes: list[str] | None = Field(default=None, max_length=8)


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return check


# The choices are named once (`engine_spec.quantization`); the schema shows them as an enum.
WeightChoice = Annotated[
    str,
    AfterValidator(_one_of(WEIGHT_CHOICES)),
    WithJsonSchema({"type": "string", "enum": list(WEIGHT_CHOICES)}),
]
KvCacheChoice = Annotated[
    str,
    AfterValidator(_one_of(KV_CACHE_CHOICES)),
    WithJsonSchema({"type": "string", "enum": list(KV_CACHE_CHOICES)}),
]


class Quantization(_Strict):
    """Weights quantization and KV-cache dtype of a deployment."""

    weights: WeightChoice = DEPLOYMENT_DEFAULTS.weight_quantization
    kv_cache: KvCacheChoice = DEPLOYMENT_DEFAULTS.kv_cache_dtype


class DeploymentPatch(_Strict):
    """`PATCH /admin/v1/deployments/{id}`: any of the replica count, the routing weight (null:
    by capacity) and whether requests may name it (ranges checked by the deployments
    service: 400 naming the field)."""

    replicas: StrictInt | None = None
    routing_weight: float | None = None
    nameable: bool | None = None
    tool_call_format: str | None = None  # null: from the chat template (checked by the service)


class DeploymentCreate(_Strict):
    """`POST /admin/v1/deployments`."""

    name: str = Field(min_length=1, max_length=128, json_schema_extra=NAME_PATTERN)
    base_model: str = Field(min_length=1, max_length=128)
    quantization: Quantization = Field(default_factory=Quantization)
    max_loras: int | None = Field(default=None, ge=1, le=4096)
    max_lora_rank: int | None = Field(default=None, ge=1, le=1024)
    replicas: int = Field(default=DEPLOYMENT_DEFAULTS.replicas, ge=0, le=1024)
    expert_parallel_size: int = Field(
        default=DEPLOYMENT_DEFAULTS.expert_parallel_size, ge=1, le=1024
    )
    share_prefix_cache: bool = DEPLOYMENT_DEFAULTS.share_prefix_cache
    cold_start_wait_s: float = Field(default=DEPLOYMENT_DEFAULTS.cold_start_wait_s, ge=0, le=3600)
    deterministic: bool = DEPLOYMENT_DEFAULTS.deterministic  # batch-invariant kernels
    # Share of its base model's routed traffic (null: by capacity); see gateway/router.py.
    routing_weight: float | None = Field(default=None, ge=0, le=1000)
    nameable: bool = DEPLOYMENT_DEFAULTS.nameable  # requests may pick it (X-Loraplex-Deployment)
    # How tool calls are read in free output (tokenizing/tool_calls.py); null: from the template.
    tool_call_format: str | None = Field(default=None, max_length=64)
    # Speculative decoding {"method", "k_min", "k_max", "draft_model"} (checked by the
    # deployments service against engine_spec.speculative: 400 naming it); null: off.
    speculative: dict[str, Any] | None = None


class PresignedUploadCreate(_Strict):
    """`POST /v1/adapters/{name}/uploads`: the config inline, the weights' size for the plan."""

    base_model: str = Field(min_length=1, max_length=128)
    adapter_config: dict[str, Any]
    size: int = Field(ge=1)


class UploadedPart(_Strict):
    """One uploaded part: its number and the ETag S3 returned for it."""

    part_number: int = Field(ge=1, le=10_000)
    etag: str = Field(min_length=1, max_length=256)


class UploadComplete(_Strict):
    """`POST /v1/adapters/{name}/uploads/{id}/complete`."""

    parts: list[UploadedPart] = Field(min_length=1, max_length=10_000)


def _ts(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def tenant_view(t: Tenant) -> dict[str, Any]:
    """A tenant as the API shows it."""
    return {
        "object": "tenant",
        "id": str(t.id),
        "name": t.name,
        "created_at": _ts(t.created_at),
        "suspended_at": _ts(t.suspended_at) if t.suspended_at is not None else None,
        "limits": {
            "requests_per_minute": t.requests_per_minute,
            "tokens_per_minute": t.tokens_per_minute,
            "monthly_token_quota": t.monthly_token_quota,
            "max_concurrent_uploads": t.max_concurrent_uploads,
            "max_stored_adapter_bytes": t.max_stored_adapter_bytes,
        },
    }


def api_key_view(k: ApiKey, plain: str | None = None) -> dict[str, Any]:
    """An API key (the plain `key` only at creation)."""
    view = {
        "object": "api_key",
        "id": str(k.id),
        "tenant_id": str(k.tenant_id),
        "name": k.name,
        "prefix": k.prefix,
        "scopes": list(k.scopes or []),
        "created_at": _ts(k.created_at),
        "last_used_at": _ts(k.last_used_at),
        "revoked_at": _ts(k.revoked_at),
    }
    if plain is not None:
        view["key"] = plain
    return view


def base_model_view(m: BaseModelRow) -> dict[str, Any]:
    """A registered base model."""
    return {
        "object": "base_model",
        "id": str(m.id),
        "name": m.name,
        "family": m.family,
        "object_prefix": m.object_prefix,
        "created_at": _ts(m.created_at),
    }


def deployment_view(d: Deployment) -> dict[str, Any]:
    """A deployment."""
    return {
        "object": "deployment",
        "id": str(d.id),
        "name": d.name,
        "base_model": d.base_model.name if d.base_model else None,
        "quantization": {"weights": d.weight_quantization, "kv_cache": d.kv_cache_dtype},
        "max_loras": d.max_loras,
        "max_lora_rank": d.max_lora_rank,
        "replicas": d.replicas,
        "expert_parallel_size": d.expert_parallel_size,
        "share_prefix_cache": d.share_prefix_cache,
        "cold_start_wait_s": d.cold_start_wait_s,
        "deterministic": bool(d.deterministic),
        "routing_weight": d.routing_weight,
        "nameable": bool(d.nameable),
        "tool_call_format": d.tool_call_format,
        "speculative": d.speculative,
        "created_at": _ts(d.created_at),
    }


def version_view(a: Adapter, v: AdapterVersion) -> dict[str, Any]:
    """One adapter version and its validation state."""
    return {
        "object": "adapter.version",
        "id": str(v.id),
        "adapter_id": str(a.id),
        "name": a.name,
        "version": v.n,
        "status": v.status,
        "error": v.error,
        "sha256": v.sha256,
        "config_sha256": v.config_sha256,
        "bytes": v.bytes,
        "rank": v.rank,
        "alpha": v.alpha,
        "use_rslora": v.use_rslora,
        "target_modules": v.target_modules,
        "created_at": _ts(v.created_at),
        "updated_at": _ts(v.updated_at),
    }


def upload_accepted_view(v: AdapterVersion, name: str) -> dict[str, Any]:
    """The 202 answer to an upload."""
    return {
        "object": "adapter.version",
        "id": str(v.adapter_id),
        "version_id": str(v.id),
        "name": name,
        "version": v.n,
        "status": v.status,
    }


def adapter_view(a: Adapter, latest: AdapterVersion | None) -> dict[str, Any]:
    """An adapter with its latest version's state."""
    return {
        "object": "adapter",
        "id": str(a.id),
        "name": a.name,
        "base_model": a.base_model.name if a.base_model else None,
        "created_at": _ts(a.created_at),
        "version": latest.n if latest else None,
        "status": latest.status if latest else None,
        "error": latest.error if latest else None,
        "latest_version": version_view(a, latest) if latest else None,
    }

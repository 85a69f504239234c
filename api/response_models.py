"""Response models of the admin and tenant APIs, for the OpenAPI document (and checked on the
routes that return plain dicts). The views in `schemas.py` build the dicts these describe."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Out):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None
    request_id: str | None = None


class ErrorResponse(_Out):
    """Every 4xx and 5xx answer: `{"error": {...}}`."""

    error: ErrorDetail


class TenantLimitsOut(_Out):
    """A tenant's own limits (null: the deployment default)."""

    requests_per_minute: int | None
    tokens_per_minute: int | None
    monthly_token_quota: int | None
    max_concurrent_uploads: int | None
    max_stored_adapter_bytes: int | None


class TenantOut(_Out):
    """A tenant."""

    object: Literal["tenant"]
    id: str
    name: str
    created_at: str | None
    suspended_at: str | None
    limits: TenantLimitsOut


class TenantList(_Out):
    """`GET /admin/v1/tenants`."""

    object: Literal["list"]
    data: list[TenantOut]


class ApiKeyOut(_Out):
    """An API key (no secret)."""

    object: Literal["api_key"]
    id: str
    tenant_id: str
    name: str
    prefix: str
    scopes: list[str]
    created_at: str | None
    last_used_at: str | None
    revoked_at: str | None


class ApiKeyCreated(ApiKeyOut):
    """A new API key: the plain `key` is shown this once."""

    key: str


class ApiKeyList(_Out):
    """`GET /admin/v1/tenants/{id}/api-keys`."""

    object: Literal["list"]
    data: list[ApiKeyOut]


class QuantizationOut(_Out):
    """Weights quantization and KV-cache dtype."""

    weights: str
    kv_cache: str


class DeploymentOut(_Out):
    """A deployment."""

    object: Literal["deployment"]
    id: str
    name: str
    base_model: str | None
    quantization: QuantizationOut
    max_loras: int | None
    max_lora_rank: int | None
    replicas: int
    expert_parallel_size: int
    share_prefix_cache: bool
    cold_start_wait_s: float
    deterministic: bool
    routing_weight: float | None
    nameable: bool
    tool_call_format: str | None
    speculative: dict[str, Any] | None = None
    created_at: str | None


class DeploymentReplicasOut(_Out):
    """`GET /admin/v1/deployments/{id}/replicas`: ready and starting replicas, and the count
    the row asks for."""

    object: Literal["deployment.replicas"]
    deployment: str
    desired: int
    ready: int
    starting: int


class DeploymentList(_Out):
    """`GET /admin/v1/deployments`."""

    object: Literal["list"]
    data: list[DeploymentOut]


class BaseModelOut(_Out):
    """A registered base model."""

    object: Literal["base_model"]
    id: str
    name: str
    family: str | None
    object_prefix: str | None
    created_at: str | None


class BaseModelList(_Out):
    """`GET /admin/v1/base-models`."""

    object: Literal["list"]
    data: list[BaseModelOut]


class VersionOut(_Out):
    """One adapter version and its validation state."""

    object: Literal["adapter.version"]
    id: str
    adapter_id: str
    name: str
    version: int
    status: str
    error: str | None
    sha256: str | None
    config_sha256: str | None
    bytes: int | None
    rank: int | None
    alpha: float | None
    use_rslora: bool | None
    target_modules: list[str] | str | None
    created_at: str | None
    updated_at: str | None


class UploadAccepted(_Out):
    """The 202 answer to an upload: the new version, being validated."""

    object: Literal["adapter.version"]
    id: str
    version_id: str
    name: str
    version: int
    status: str


class PresignedPart(_Out):
    """One part's presigned PUT URL (its Content-Length is signed)."""

    part_number: int
    size: int
    url: str


class PresignedUpload(UploadAccepted):
    """`POST /v1/adapters/{name}/uploads`: where to PUT the parts, and where to complete."""

    upload_id: str
    part_size: int
    parts: list[PresignedPart]
    expires_in: int
    complete_url: str


class AdapterOut(_Out):
    """An adapter with its latest version's state."""

    object: Literal["adapter"]
    id: str
    name: str
    base_model: str | None
    created_at: str | None
    version: int | None
    status: str | None
    error: str | None
    latest_version: VersionOut | None


class AdapterList(_Out):
    """`GET /v1/adapters`."""

    object: Literal["list"]
    data: list[AdapterOut]


class AdapterDeleted(_Out):
    """`DELETE /v1/adapters/{name}`: a job removes the objects."""

    object: Literal["adapter.deleted"]
    id: str
    name: str
    deleted: bool
    job_id: str

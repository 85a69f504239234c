"""SQLAlchemy 2 typed models of the control plane.

Every tenant-owned row carries `tenant_id`; queries for a tenant must filter by it. The
Alembic revisions in `migrations/` build exactly this schema (a test compares them).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from loraplex.platform.engine_spec.deployment import DEPLOYMENT_DEFAULTS, sql_default
from loraplex.platform.engine_spec.quantization import KV_CACHE_CHOICES, WEIGHT_CHOICES
from loraplex.platform.tokenizing.tool_calls import FAMILIES as TOOL_CALL_FORMATS

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

FAMILIES = ("dense", "moe")
# "auto": the device's native compute type (bf16 where the CPU or GPU computes it natively,
# else fp32), or the scheme a pre-quantized checkpoint fixes.
WEIGHT_QUANTIZATIONS = WEIGHT_CHOICES
KV_CACHE_DTYPES = KV_CACHE_CHOICES
VERSION_STATUSES = ("uploading", "validating", "ready", "failed", "deleting")
JOB_STATUSES = ("queued", "running", "succeeded", "failed")
IDEMPOTENCY_STATES = ("in_flight", "done")
OPERATOR_ROLES = ("owner", "operator", "viewer")

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def _default(field: str) -> str:
    """A deployment column's server default: `engine_spec`'s default for it, as SQL text."""
    return sql_default(getattr(DEPLOYMENT_DEFAULTS, field))


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    """Declarative base with a constraint naming convention so migrations stay in step."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _uuid_pk() -> Mapped[uuid.UUID]:
    return mapped_column(Uuid, primary_key=True, default=uuid.uuid4)


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


def _tenant_fk(nullable: bool = False) -> Mapped[Any]:
    return mapped_column(
        Uuid, ForeignKey("tenants.id", ondelete="CASCADE"), nullable=nullable, index=True
    )


class Tenant(Base):
    """A customer: owns API keys, adapters, jobs and usage."""

    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = _created()
    # Per-tenant limits; NULL means the deployment default from Settings.
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    monthly_token_quota: Mapped[int | None] = mapped_column(BigInteger)
    # Upload bounds; NULL means the default from Settings.
    max_concurrent_uploads: Mapped[int | None] = mapped_column(Integer)
    max_stored_adapter_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Set while the tenant is suspended: every one of its keys is refused (403).
    suspended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ApiKey(Base):
    """A tenant's API key: only its sha256 hash and a display prefix are stored."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSONB, server_default="[]")
    created_at: Mapped[datetime] = _created()
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Loaded with the key (one query) so the gateway has the tenant's limits on auth.
    tenant: Mapped[Tenant] = relationship(lazy="joined", innerjoin=True)


class BaseModel(Base):
    """A registered base model: its files live under `object_prefix` in the bucket."""

    __tablename__ = "base_models"
    __table_args__ = (CheckConstraint(_in("family", FAMILIES), name="family"),)

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(128), unique=True)
    family: Mapped[str] = mapped_column(String(16))
    object_prefix: Mapped[str] = mapped_column(String(512))
    config: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created()


class Deployment(Base):
    """How a base model is served: quantization, LoRA slots, replicas, expert parallelism."""

    __tablename__ = "deployments"
    __table_args__ = (
        CheckConstraint(_in("weight_quantization", WEIGHT_QUANTIZATIONS), name="weight_q"),
        CheckConstraint(_in("kv_cache_dtype", KV_CACHE_DTYPES), name="kv_cache"),
        CheckConstraint("max_loras >= 1", name="max_loras"),
        CheckConstraint("max_lora_rank >= 1", name="max_lora_rank"),
        CheckConstraint("replicas >= 0", name="replicas"),
        CheckConstraint("expert_parallel_size >= 1", name="ep_size"),
        CheckConstraint("cold_start_wait_s >= 0", name="cold_start_wait"),
        CheckConstraint(
            "routing_weight IS NULL OR (routing_weight >= 0 AND routing_weight <= 1000)",
            name="routing_weight",
        ),
        CheckConstraint(
            f"tool_call_format IS NULL OR {_in('tool_call_format', TOOL_CALL_FORMATS)}",
            name="tool_call_format",
        ),
    )

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(128), unique=True)
    base_model_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("base_models.id", ondelete="RESTRICT"), index=True
    )
    weight_quantization: Mapped[str] = mapped_column(String(8))
    kv_cache_dtype: Mapped[str] = mapped_column(String(8))
    max_loras: Mapped[int] = mapped_column(Integer)
    max_lora_rank: Mapped[int] = mapped_column(Integer)
    replicas: Mapped[int] = mapped_column(Integer)
    expert_parallel_size: Mapped[int] = mapped_column(Integer)
    share_prefix_cache: Mapped[bool] = mapped_column(
        Boolean, server_default=_default("share_prefix_cache")
    )
    # How long a request waits for a first ready replica when all are still starting (a cold
    # start, a scale from zero) before the gateway answers 503 with Retry-After.
    cold_start_wait_s: Mapped[float] = mapped_column(
        Float, server_default=_default("cold_start_wait_s")
    )
    # Replicas run the deterministic mode (batch-invariant kernels; engine_spec maps it).
    deterministic: Mapped[bool] = mapped_column(Boolean, server_default=_default("deterministic"))
    # Its share of the traffic routed to its base model (gateway/router.py); NULL: by capacity.
    routing_weight: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Whether a request may pick it by name (the `X-Loraplex-Deployment` header).
    nameable: Mapped[bool] = mapped_column(Boolean, server_default=_default("nameable"))
    # How the gateway reads tool calls in free output (tokenizing/tool_calls.py); NULL: from
    # the chat template.
    tool_call_format: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Speculative decoding: {"method", "k_min", "k_max", "draft_model"} as engine_spec's
    # SpeculativeOption reads it; NULL: off.
    speculative: Mapped[dict[str, Any] | None] = mapped_column(
        JSONB(none_as_null=True), nullable=True
    )
    created_at: Mapped[datetime] = _created()

    base_model: Mapped[BaseModel] = relationship(lazy="joined")


class Adapter(Base):
    """A tenant's named adapter over one base model; its content lives in versions.

    A deleted adapter keeps its row (`deleted_at` set, invisible to the tenant, its name free
    again) until the deletion job has removed its objects: no object is left without a row."""

    __tablename__ = "adapters"
    __table_args__ = (
        Index(
            "uq_adapters_tenant_id_name_live",
            "tenant_id",
            "name",
            unique=True,
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    name: Mapped[str] = mapped_column(String(128))
    base_model_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("base_models.id", ondelete="RESTRICT"), index=True
    )
    created_at: Mapped[datetime] = _created()
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    base_model: Mapped[BaseModel] = relationship(lazy="joined")


class AdapterVersion(Base):
    """One immutable upload of an adapter: files under `object_prefix`, validated by a job."""

    __tablename__ = "adapter_versions"
    __table_args__ = (
        UniqueConstraint("adapter_id", "n"),
        # The console's adapter list across tenants: newest first, optionally by status.
        Index(None, "created_at"),
        Index(None, "status", "created_at"),
        CheckConstraint(_in("status", VERSION_STATUSES), name="status"),
        CheckConstraint("n >= 1", name="n_positive"),
    )

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    adapter_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("adapters.id", ondelete="CASCADE"), index=True
    )
    n: Mapped[int] = mapped_column(Integer)
    object_prefix: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    sha256: Mapped[str | None] = mapped_column(String(64))
    config_sha256: Mapped[str | None] = mapped_column(String(64))
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    rank: Mapped[int | None] = mapped_column(Integer)
    alpha: Mapped[float | None] = mapped_column(Float)
    use_rslora: Mapped[bool | None] = mapped_column(Boolean)
    target_modules: Mapped[list[str] | None] = mapped_column(JSONB)
    # Every targeted module with its rank, alpha and scale, resolved once at validation
    # (`loraplex.adapters.targets.ResolvedTargets.to_json`); replicas get this, not patterns.
    targets: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    s3_upload_id: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )

    @property
    def config_key(self) -> str:
        """Object key of this version's `adapter_config.json`."""
        return self.object_prefix + ADAPTER_CONFIG_FILE

    @property
    def weights_key(self) -> str:
        """Object key of this version's `adapter_model.safetensors`."""
        return self.object_prefix + ADAPTER_WEIGHTS_FILE


class DraftAdapter(Base):
    """A draft adapter (issue 25): a small LoRA for a deployment's draft model, tied to one of
    the tenant's adapter versions and validated against that draft model (`draft_model`, the
    deployment's `speculative.draft_model`). Replicas drafting with that model run the target
    version's requests' drafts with it. One per (target version, draft model); its files live
    in the target version's folder, so they go with it."""

    __tablename__ = "draft_adapters"
    __table_args__ = (
        UniqueConstraint("adapter_version_id", "draft_model"),
        CheckConstraint(_in("status", VERSION_STATUSES), name="status"),
    )

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    adapter_version_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("adapter_versions.id", ondelete="CASCADE"), index=True
    )
    draft_model: Mapped[str] = mapped_column(String(1024))
    object_prefix: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    sha256: Mapped[str | None] = mapped_column(String(64))
    config_sha256: Mapped[str | None] = mapped_column(String(64))
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    rank: Mapped[int | None] = mapped_column(Integer)
    alpha: Mapped[float | None] = mapped_column(Float)
    targets: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )

    @property
    def config_key(self) -> str:
        """Object key of this draft adapter's `adapter_config.json`."""
        return self.object_prefix + ADAPTER_CONFIG_FILE

    @property
    def weights_key(self) -> str:
        """Object key of this draft adapter's `adapter_model.safetensors`."""
        return self.object_prefix + ADAPTER_WEIGHTS_FILE


class Job(Base):
    """A background job's record: what, for whom, its state and heartbeat (for stale requeue)."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        Index(None, "kind", "status"),
        Index(None, "created_at"),
    )

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID | None] = _tenant_fk(nullable=True)
    kind: Mapped[str] = mapped_column(String(64))
    subject_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    status: Mapped[str] = mapped_column(String(16))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = _created()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UsageRecord(Base):
    """Tokens used by one request, for metering and quotas."""

    __tablename__ = "usage_records"
    __table_args__ = (
        Index(None, "tenant_id", "created_at"),
        # The console's per-minute charts over every tenant read a time range: an index-only
        # scan of the columns they aggregate.
        Index(
            None,
            "created_at",
            postgresql_include=["completion_tokens", "ttft_ms", "itl_ms", "failed"],
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    deployment_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    adapter_version_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    model: Mapped[str] = mapped_column(String(256))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    latency_ms: Mapped[int] = mapped_column(Integer, server_default="0")
    # Time to the first token and the mean gap between later tokens (None: no token came);
    # `failed`: the request broke after it was admitted (the console's error rate).
    ttft_ms: Mapped[int | None] = mapped_column(Integer)
    itl_ms: Mapped[float | None] = mapped_column(Float)
    failed: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = _created()


class AuditLog(Base):
    """Who did what to which resource; admin actions have no tenant."""

    __tablename__ = "audit_log"
    __table_args__ = (Index(None, "created_at"), Index(None, "action", "created_at"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[uuid.UUID | None] = _tenant_fk(nullable=True)
    actor: Mapped[str] = mapped_column(String(128))
    # The console operator who did it (None for the admin key, tenants and the system).
    operator_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("operators.id", ondelete="SET NULL"), index=True
    )
    action: Mapped[str] = mapped_column(String(64))
    resource_type: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[str | None] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    created_at: Mapped[datetime] = _created()


class IdempotencyKey(Base):
    """A stored response for an `Idempotency-Key`, scoped to one caller (admin or a tenant)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (
        UniqueConstraint("scope", "key"),
        CheckConstraint(_in("state", IDEMPOTENCY_STATES), name="state"),
    )

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID | None] = _tenant_fk(nullable=True)
    scope: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(255))
    fingerprint: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    response_status: Mapped[int | None] = mapped_column(Integer)
    response_body: Mapped[Any | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created()


class Operator(Base):
    """A console user: email, argon2id password hash and role (owner, operator, viewer)."""

    __tablename__ = "operators"
    __table_args__ = (CheckConstraint(_in("role", OPERATOR_ROLES), name="role"),)

    id: Mapped[uuid.UUID] = _uuid_pk()
    email: Mapped[str] = mapped_column(String(254), unique=True)
    password_hash: Mapped[str] = mapped_column(String(512))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = _created()
    last_login_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A one-time link to set the password (an invitation or a reset): only its sha256 is
    # stored, with its expiry; cleared when used.
    invite_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    invite_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ConsoleSession(Base):
    """A signed-in console session: only the sha256 of its cookie token is stored."""

    __tablename__ = "console_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    operator_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("operators.id", ondelete="CASCADE"), index=True
    )
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _created()
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    operator: Mapped[Operator] = relationship(lazy="joined", innerjoin=True)


class RequestLog(Base):
    """A tenant request the API refused or failed (status >= 400, or an error event inside a
    200 stream): what the console's charts count as refusals, and what an operator finds by
    the request id a tenant reports (kept for `Settings.request_log_retention_days`; `detail`
    is what the tenant was not shown)."""

    __tablename__ = "request_log"
    __table_args__ = (Index(None, "created_at", postgresql_include=["status", "path"]),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(128), index=True)
    created_at: Mapped[datetime] = _created()
    tenant_id: Mapped[uuid.UUID | None] = _tenant_fk(nullable=True)
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(256))
    status: Mapped[int] = mapped_column(Integer)
    code: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[int] = mapped_column(Integer)
    # What the gateway routed it to (migration 0017): the deployment, the adapter and version
    # asked for, the replica(s) tried; `in_stream`: an error event after a 200 stream began.
    deployment: Mapped[str | None] = mapped_column(String(128))
    adapter_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    adapter: Mapped[str | None] = mapped_column(String(128))
    adapter_version: Mapped[int | None] = mapped_column(Integer)
    replica: Mapped[str | None] = mapped_column(String(256))
    in_stream: Mapped[bool] = mapped_column(Boolean, server_default="false")

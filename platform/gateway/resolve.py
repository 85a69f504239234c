"""Resolve the `model` a client names to what serves it, for one tenant.

`NAME` is the tenant's adapter NAME at its latest ready version, `NAME:N` that adapter's
version N (ready only), anything else a base model by name. Another tenant's adapter is
invisible: the same 404 `model_not_found` as a name that does not exist.

A base model is served by every deployment of it (a bf16 one and an int4 one, an old
version and its replacement): the answer names them all, oldest first
(`deployment_names`; `deployment_name`, which usage and metrics are labelled with, is the
oldest), and a resolution publishes that group in Redis beside the replica registry
(`publish_group`), where the router reads it to route over the live replicas of all of them.

Positive answers are cached in process for a short TTL (`resolve_cache_ttl_s`, 2 s) and
keyed by a per-tenant generation counter in Redis: whoever changes an adapter (a version
turning ready or failed, a deletion) calls `services.resolution_events.bump_generation` and the next request sees the
change at once; without a bump a change shows within the TTL. Misses are never cached: an
adapter is callable the moment it is ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.adapters.identity import adapter_ref_key
from loraplex.platform.db.models import Adapter, AdapterVersion, BaseModel, Deployment
from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.deployment_choice import DEPLOYMENT_HEADER, DeploymentRoute
from loraplex.platform.gateway.errors import model_not_found
from loraplex.platform.gateway.replicas import DEFAULT_PREFIX
from loraplex.platform.gateway.single_flight import SingleFlight
from loraplex.platform.gateway.streaming import spawn
from loraplex.platform.services.draft_adapters import ready_drafts
from loraplex.platform.services.resolution_events import GEN_KEY
from loraplex.platform.wire import AdapterRef, DraftAdapterRef
from loraplex.platform.wire.auth import cache_salt
from loraplex.platform.wire.messages import MAX_DRAFT_ADAPTERS

_VERSIONED = re.compile(r"^(?P<name>.+):(?P<n>[1-9][0-9]{0,8})$")
# How long a published deployment group lives without a resolution refreshing it.
GROUP_TTL_S = 300


def group_key(prefix: str, deployment: str) -> str:
    """The Redis key holding the deployments that serve `deployment`'s base model."""
    return f"{prefix}:group:{deployment}"


async def publish_group(
    redis: Redis, names: list[str] | tuple[str, ...], prefix: str = DEFAULT_PREFIX
) -> None:
    """Record that `names` (oldest first) serve one base model, under the oldest's name."""
    if names:
        await redis.set(group_key(prefix, names[0]), json.dumps(list(names)), ex=GROUP_TTL_S)


@dataclass(frozen=True)
class ResolvedModel:
    """Where a request goes: the deployment, its base model and the adapter version (if any)."""

    model: str
    base_model_id: uuid.UUID
    base_model_name: str
    base_object_prefix: str
    deployment_id: uuid.UUID
    deployment_name: str
    share_prefix_cache: bool
    adapter_id: uuid.UUID | None = None
    adapter_name: str | None = None
    adapter_version_id: uuid.UUID | None = None
    adapter_version: int | None = None
    adapter_sha256: str | None = None
    adapter_config_sha256: str | None = None
    adapter_object_prefix: str | None = None
    # The version's resolved targets (module -> rank/alpha/scale), for the replica: it
    # never reads the tenant's patterns.
    adapter_targets: dict[str, Any] | None = None
    base_created: int = 0  # the base model row's creation time (epoch seconds)
    # How long to wait for a starting replica before 503 (the deployment's setting).
    cold_start_wait_s: float = 0.0
    # Every deployment of the base model, oldest first (`deployment_name` is the first).
    deployment_names: tuple[str, ...] = ()
    # The same deployments with the operator's routing weights (`deployment_choice.py`).
    deployment_routes: tuple[DeploymentRoute, ...] = ()
    # How tool calls in free output are read: the resolved deployment's `tool_call_format`
    # (None: the format the chat template teaches).
    tool_call_format: str | None = None
    # The ready draft adapters tied to the version (one per draft model), for the replica.
    adapter_drafts: tuple[DraftAdapterRef, ...] = ()

    @property
    def adapter_key(self) -> str | None:
        """The version's identity (weights and config): what the replica's caches key by."""
        if self.adapter_sha256 is None:
            return None
        return adapter_ref_key(self.adapter_sha256, self.adapter_config_sha256)

    def cache_salt(self, tenant_id: uuid.UUID | str, secret: str) -> str | None:
        """Prefix-cache salt: per tenant (an HMAC of its id under the replica secret, so it
        cannot be derived from the id alone) unless the deployment opts into sharing."""
        return None if self.share_prefix_cache else cache_salt(secret, str(tenant_id))


def adapter_ref(resolved: ResolvedModel, tenant_id: uuid.UUID) -> AdapterRef | None:
    """The replica-side adapter reference: where the version's files are and their sha256s.

    `config_sha256` makes the config part of the replica's cache identity (`AdapterRef.key`)."""
    if resolved.adapter_sha256 is None:
        return None
    return AdapterRef(
        object_prefix=resolved.adapter_object_prefix or "",
        sha256=resolved.adapter_sha256,
        config_sha256=resolved.adapter_config_sha256,
        tenant=str(tenant_id),
        targets=resolved.adapter_targets,
        drafts=list(resolved.adapter_drafts) or None,
    )


def _draft_refs(session: Session, version: AdapterVersion) -> tuple[DraftAdapterRef, ...]:
    """The version's ready draft adapters as wire references (issue 25)."""
    return tuple(
        DraftAdapterRef(
            object_prefix=d.object_prefix,
            sha256=d.sha256 or "",
            config_sha256=d.config_sha256,
            tenant=str(d.tenant_id),
            targets=d.targets,
            draft_model=d.draft_model,
        )
        for d in ready_drafts(session, [version.id]).get(version.id, [])[:MAX_DRAFT_ADAPTERS]
    )


def _deployments_for(session: Session, base_model_id: uuid.UUID) -> list[Deployment]:
    """Every deployment of the base model, oldest first."""
    stmt = (
        select(Deployment)
        .where(Deployment.base_model_id == base_model_id)
        .order_by(Deployment.created_at, Deployment.name)
    )
    return list(session.execute(stmt).scalars())


class NoDeployment(HttpError):
    """The model exists but no deployment serves its base model: to a tenant that is not a
    model one can use (404, as `/v1/models` does not list it either)."""


def _no_deployment(model: str) -> HttpError:
    return NoDeployment(
        404,
        f"The model `{model}` does not exist or is not deployed.",
        type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def _ready_version(
    session: Session, tenant_id: uuid.UUID, name: str, n: int | None
) -> tuple[Adapter, AdapterVersion] | None:
    adapter = session.execute(
        select(Adapter).where(
            Adapter.tenant_id == tenant_id, Adapter.name == name, Adapter.deleted_at.is_(None)
        )
    ).scalar_one_or_none()
    if adapter is None:
        return None
    stmt = select(AdapterVersion).where(
        AdapterVersion.tenant_id == tenant_id,
        AdapterVersion.adapter_id == adapter.id,
        AdapterVersion.status == "ready",
    )
    stmt = (
        stmt.where(AdapterVersion.n == n)
        if n is not None
        else stmt.order_by(AdapterVersion.n.desc())
    )
    version = session.execute(stmt.limit(1)).scalars().first()
    return (adapter, version) if version is not None else None


def _resolved(session: Session, model: str, base: BaseModel, **adapter: Any) -> ResolvedModel:
    """A ResolvedModel for `base` on its deployments (404 when it has none)."""
    deps = _deployments_for(session, base.id)
    if not deps:
        raise _no_deployment(model)
    dep = deps[0]
    return ResolvedModel(
        model=model,
        base_model_id=base.id,
        base_model_name=base.name,
        base_object_prefix=base.object_prefix,
        deployment_id=dep.id,
        deployment_name=dep.name,
        share_prefix_cache=bool(dep.share_prefix_cache),
        cold_start_wait_s=max(float(d.cold_start_wait_s) for d in deps),
        deployment_names=tuple(d.name for d in deps),
        deployment_routes=tuple(
            DeploymentRoute(
                name=d.name,
                id=d.id,
                weight=d.routing_weight,
                nameable=bool(d.nameable),
                cold_start_wait_s=float(d.cold_start_wait_s),
                tool_call_format=d.tool_call_format,
            )
            for d in deps
        ),
        tool_call_format=dep.tool_call_format,
        base_created=int(base.created_at.timestamp()),
        **adapter,
    )


def with_named_deployment(resolved: ResolvedModel, name: str | None) -> ResolvedModel:
    """`resolved` routed to the one deployment a request names (the `X-Loraplex-Deployment`
    header), which must serve its base model and be one the operator made nameable; the
    request is metered to it. Unchanged when no deployment is named."""
    if name is None:
        return resolved
    route = next((r for r in resolved.deployment_routes if r.name == name), None)
    if route is None:
        raise HttpError(
            404,
            f"No deployment named `{name}` serves the model `{resolved.model}` "
            f"(the {DEPLOYMENT_HEADER} header).",
            code="deployment_not_found",
            type="invalid_request_error",
        )
    if not route.nameable:
        raise HttpError(
            403,
            f"The deployment `{name}` cannot be chosen by requests; "
            f"leave out the {DEPLOYMENT_HEADER} header to be routed.",
            code="deployment_not_nameable",
            type="permission_error",
        )
    return dataclasses.replace(
        resolved,
        deployment_id=route.id,
        deployment_name=route.name,
        cold_start_wait_s=route.cold_start_wait_s,
        deployment_names=(route.name,),
        deployment_routes=(route,),
        tool_call_format=route.tool_call_format,
    )


def resolve_uncached(session: Session, tenant_id: uuid.UUID, model: str) -> ResolvedModel:
    """Look `model` up in PostgreSQL for `tenant_id`; 404 `model_not_found` when invisible."""
    match = _VERSIONED.match(model)
    found = None
    if match:
        found = _ready_version(session, tenant_id, match["name"], int(match["n"]))
    if found is None:
        found = _ready_version(session, tenant_id, model, None)
    if found is not None:
        adapter, version = found
        return _resolved(
            session,
            model,
            adapter.base_model,
            adapter_id=adapter.id,
            adapter_name=adapter.name,
            adapter_version_id=version.id,
            adapter_version=version.n,
            adapter_sha256=version.sha256,
            adapter_config_sha256=version.config_sha256,
            adapter_object_prefix=version.object_prefix,
            adapter_targets=version.targets,
            adapter_drafts=_draft_refs(session, version),
        )
    base = session.execute(select(BaseModel).where(BaseModel.name == model)).scalar_one_or_none()
    if base is None:
        _raise_if_not_ready(session, tenant_id, model, match)
        raise model_not_found(model)
    return _resolved(session, model, base)


def _raise_if_not_ready(
    session: Session, tenant_id: uuid.UUID, model: str, match: re.Match[str] | None
) -> None:
    """409 `adapter_not_ready` for the tenant's adapter that exists but has no ready version
    (the one asked for failed validation, or is still being validated), naming why."""
    for name, n in ([(match["name"], int(match["n"]))] if match else []) + [(model, None)]:
        stmt = (
            select(AdapterVersion)
            .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
            .where(
                Adapter.tenant_id == tenant_id,
                Adapter.name == name,
                Adapter.deleted_at.is_(None),
                AdapterVersion.tenant_id == tenant_id,
            )
        )
        stmt = stmt.where(AdapterVersion.n == n) if n is not None else stmt
        version = session.execute(
            stmt.order_by(AdapterVersion.n.desc()).limit(1)
        ).scalar_one_or_none()
        if version is None:
            continue
        what = f"adapter `{name}` version {version.n}"
        if version.status == "failed":
            reason = version.error or "no reason recorded"
            message = f"The {what} failed validation: {reason}. Upload a corrected version."
        else:
            message = f"The {what} is not ready yet ({version.status}); try again shortly."
        raise HttpError(409, message, param="model", code="adapter_not_ready")


@dataclass(frozen=True)
class Generation:
    """A tenant's cache generation as read for one request (`value` None: never bumped)."""

    value: bytes | None


class ModelResolver:
    """Cached resolution: one Redis GET per request instead of several SQL queries. An answer
    holds while its tenant's generation stands; past `ttl_s` (the bound when a bump is lost)
    it is served once more while it is read again behind the request."""

    def __init__(
        self,
        redis: Redis,
        ttl_s: float = 2.0,
        max_entries: int = 10_000,
        group_prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self._redis = redis
        self._group_prefix = group_prefix
        self._ttl = ttl_s
        self._max = max_entries
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[bytes | None, float, ResolvedModel]] = {}
        # concurrent misses of one (tenant, model, generation) share one query (a wave of 64
        # streams after an expiry asked 64)
        self._misses: SingleFlight[tuple[str, str, bytes | None], ResolvedModel] = SingleFlight()

    @staticmethod
    def generation_key(tenant_id: uuid.UUID | str) -> str:
        """The Redis key of the tenant's cache generation (to read it beside other keys)."""
        return GEN_KEY.format(tenant=tenant_id)

    async def generation(self, tenant_id: uuid.UUID | str) -> bytes | None:
        """The tenant's current cache generation."""
        # The gateway's client does not decode responses: bytes (or None), never str.
        return cast("bytes | None", await self._redis.get(self.generation_key(tenant_id)))

    async def invalidate(self, tenant_id: uuid.UUID | str) -> None:
        """Async twin of `services.resolution_events.bump_generation`."""
        await self._redis.incr(GEN_KEY.format(tenant=tenant_id))

    def cached(
        self, tenant_id: uuid.UUID | str, model: str, gen: bytes | None
    ) -> tuple[ResolvedModel, bool] | None:
        """A cached answer still valid for `gen`, and whether it is past its TTL (still
        served once, while it is read again behind it); None when there is none."""
        with self._lock:
            hit = self._cache.get((str(tenant_id), model))
        if hit is None:
            return None
        hit_gen, expires, resolved = hit
        if hit_gen != gen:
            return None
        return resolved, expires < time.monotonic()

    def forget(self, tenant_id: uuid.UUID | str, model: str) -> None:
        """Drop the cached answer for `model` (its refresh failed: the next request asks)."""
        with self._lock:
            self._cache.pop((str(tenant_id), model), None)

    def store(
        self, tenant_id: uuid.UUID | str, model: str, gen: bytes | None, resolved: ResolvedModel
    ) -> None:
        """Remember a positive answer under generation `gen`."""
        with self._lock:
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[(str(tenant_id), model)] = (gen, time.monotonic() + self._ttl, resolved)

    async def resolve(
        self,
        sessions: sessionmaker[Session],
        tenant_id: uuid.UUID,
        model: str,
        read: Generation | None = None,
    ) -> ResolvedModel:
        """Resolve through the cache; a miss runs its SQL in a worker thread, in a session of
        its own (never on the event loop), once for all the requests that miss together.
        `read`: the tenant's generation as the request already read it (else read here)."""
        gen = read.value if read is not None else await self.generation(tenant_id)
        hit = self.cached(tenant_id, model, gen)
        if hit is not None:
            resolved, expired = hit
            if expired:
                self._refresh_behind(sessions, tenant_id, model, gen)
            return resolved
        return await self._misses.run(
            (str(tenant_id), model, gen), lambda: self._miss(sessions, tenant_id, model, gen)
        )

    def _refresh_behind(
        self, sessions: sessionmaker[Session], tenant_id: uuid.UUID, model: str, gen: bytes | None
    ) -> None:
        """Read an answer past its TTL again without a request waiting on it (that query
        sat in one request's first token every `ttl_s`); a refresh that fails (the adapter
        went away without a bump) drops the answer, so the next request resolves itself."""
        key = (str(tenant_id), model, gen)
        if self._misses.running(key):
            return  # the refresh already under way will store (or drop) the answer
        task = spawn(self._misses.run(key, lambda: self._miss(sessions, tenant_id, model, gen)))

        def done(fut: asyncio.Future[ResolvedModel]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                self.forget(tenant_id, model)

        task.add_done_callback(done)

    async def _miss(
        self, sessions: sessionmaker[Session], tenant_id: uuid.UUID, model: str, gen: bytes | None
    ) -> ResolvedModel:
        resolved = await asyncio.to_thread(_resolve_in_session, sessions, tenant_id, model)
        await publish_group(self._redis, resolved.deployment_names, self._group_prefix)
        self.store(tenant_id, model, gen, resolved)
        return resolved


def _resolve_in_session(
    sessions: sessionmaker[Session], tenant_id: uuid.UUID, model: str
) -> ResolvedModel:
    with sessions() as session:
        return resolve_uncached(session, tenant_id, model)

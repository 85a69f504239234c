"""Tenant API keys: shown once as `lp_...`, stored as a sha256 hash plus a display prefix."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import ApiKey

from . import audit
from .auth_events import mark_auth_changed
from .errors import InvalidInput, NotFound, TenantSuspended
from .names import check_label
from .tenants import get_tenant

KEY_PREFIX = "lp_"
MAX_KEY_CHARS = 256  # longer is not a key of ours: refused without a query
PREFIX_CHARS = 12
# A key's `last_used_at` is at most this old (the console shows it); the guarded UPDATE below
# writes a hot key's row at most about once per interval.
TOUCH_INTERVAL = timedelta(seconds=1)
DEFAULT_SCOPES = ["adapters", "inference"]
KNOWN_SCOPES = frozenset(DEFAULT_SCOPES)


def hash_key(plain: str) -> str:
    """sha256 hex of a presented key (what the table stores and looks up)."""
    return hashlib.sha256(plain.encode("utf-8")).hexdigest()


def generate_key() -> tuple[str, str, str]:
    """A new random key: (plain text, display prefix, hash)."""
    plain = KEY_PREFIX + secrets.token_urlsafe(32)
    return plain, plain[:PREFIX_CHARS], hash_key(plain)


def create_api_key(
    session: Session,
    tenant_id: uuid.UUID,
    name: str,
    scopes: list[str] | None = None,
    *,
    actor: str = audit.ADMIN_ACTOR,
) -> tuple[ApiKey, str]:
    """Create a key for a tenant; returns the row and the plain key (never stored)."""
    get_tenant(session, tenant_id)
    check_label(name, "name")
    scopes = sorted(set(scopes if scopes is not None else DEFAULT_SCOPES))
    unknown = set(scopes) - KNOWN_SCOPES
    if unknown:
        raise InvalidInput(
            f"unknown scopes {sorted(unknown)}; known: {sorted(KNOWN_SCOPES)}",
            code="invalid_scope",
            param="scopes",
        )
    plain, prefix, digest = generate_key()
    key = ApiKey(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        name=name,
        prefix=prefix,
        key_hash=digest,
        scopes=scopes,
    )
    session.add(key)
    session.flush()
    audit.record(
        session,
        actor=actor,
        action="api_key.create",
        resource_type="api_key",
        resource_id=key.id,
        tenant_id=tenant_id,
        detail={"name": name, "prefix": prefix},
    )
    return key, plain


def list_api_keys(session: Session, tenant_id: uuid.UUID) -> list[ApiKey]:
    """A tenant's keys (hashes are never returned by the API)."""
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)
    return list(session.scalars(stmt))


def looks_like_key(plain: str) -> bool:
    """Whether `plain` could be one of our keys at all (else it is refused without a query)."""
    return plain.startswith(KEY_PREFIX) and len(plain) <= MAX_KEY_CHARS


def verify_api_key(session: Session, plain: str) -> ApiKey | None:
    """The live (not revoked) key matching `plain`, or None; `TenantSuspended` (403) when its
    tenant is suspended (the tenant comes in the same query)."""
    if not looks_like_key(plain):
        return None
    stmt = select(ApiKey).where(ApiKey.key_hash == hash_key(plain), ApiKey.revoked_at.is_(None))
    key = session.scalars(stmt).one_or_none()
    if key is not None and key.tenant.suspended_at is not None:
        raise TenantSuspended(
            "This API key's organization is suspended. Contact the platform operator.",
            code="tenant_suspended",
        )
    return key


@dataclass(frozen=True)
class KeyUse:
    """A live key that was just used: whose it is, what it may do, and its tenant's own limits
    (None where the tenant has none: the Settings defaults apply)."""

    key_id: uuid.UUID
    tenant_id: uuid.UUID
    scopes: tuple[str, ...]
    requests_per_minute: int | None
    tokens_per_minute: int | None
    monthly_token_quota: int | None


def use_api_key(sessions: sessionmaker[Session], plain: str) -> KeyUse | None:
    """Look `plain` up and record its use, in one transaction of its own (call it off the
    event loop); None for an unknown or revoked key."""
    with sessions() as session, session.begin():
        key = verify_api_key(session, plain)
        if key is None:
            return None
        touch_last_used(session, key)
        tenant = key.tenant
        return KeyUse(
            key.id,
            key.tenant_id,
            tuple(key.scopes or ()),
            tenant.requests_per_minute,
            tenant.tokens_per_minute,
            tenant.monthly_token_quota,
        )


def touch_key_use(sessions: sessionmaker[Session], key_id: uuid.UUID) -> None:
    """Record the use of a key the gateway verified from its cache (off the event loop)."""
    with sessions() as session, session.begin():
        _touch(session, key_id, datetime.now(UTC))


def _touch(session: Session, key_id: uuid.UUID, now: datetime) -> None:
    """The guarded UPDATE: concurrent uses of one key write its `last_used_at` once."""
    stale = or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < now - TOUCH_INTERVAL)
    session.execute(update(ApiKey).where(ApiKey.id == key_id, stale).values(last_used_at=now))


def touch_last_used(session: Session, key: ApiKey) -> None:
    """Record use, at most once per TOUCH_INTERVAL per key, so hot keys do not write on every
    request (the UPDATE is guarded too: concurrent requests of one key write once)."""
    now = datetime.now(UTC)
    if key.last_used_at is not None and now - key.last_used_at < TOUCH_INTERVAL:
        return
    _touch(session, key.id, now)
    key.last_used_at = now


def revoke_api_key(
    session: Session, key_id: uuid.UUID, *, actor: str = audit.ADMIN_ACTOR
) -> ApiKey:
    """Revoke a key (idempotent: revoking twice keeps the first time)."""
    key = session.get(ApiKey, key_id, with_for_update=True)
    if key is None:
        raise NotFound(f"no API key with id {key_id}", code="api_key_not_found")
    mark_auth_changed(session)
    if key.revoked_at is None:
        key.revoked_at = datetime.now(UTC)
        audit.record(
            session,
            actor=actor,
            action="api_key.revoke",
            resource_type="api_key",
            resource_id=key.id,
            tenant_id=key.tenant_id,
        )
    return key

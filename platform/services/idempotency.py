"""`Idempotency-Key` for creating requests (IETF draft semantics).

Same key and same request -> the stored response again; same key, another request -> 422;
the first request still running -> 409. Keys are scoped per caller (admin or a tenant).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import IdempotencyKey
from loraplex.platform.db.session import session_scope

from .errors import Conflict, InvalidInput, Unprocessable

MAX_KEY_LENGTH = 255
IN_FLIGHT_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class StoredResponse:
    """A response recorded for a key, to replay."""

    status: int
    body: Any


def fingerprint(*parts: Any) -> str:
    """A stable hash of what identifies a request (method, path, canonical body)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def check_key(key: str) -> str:
    """Refuse empty, over-long or non-printable keys."""
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise InvalidInput(
            f"Idempotency-Key must be 1..{MAX_KEY_LENGTH} printable characters",
            code="invalid_idempotency_key",
            param="Idempotency-Key",
        )
    return key


def begin(
    sessions: sessionmaker[Session],
    scope: str,
    key: str,
    fp: str,
    tenant_id: uuid.UUID | None = None,
) -> StoredResponse | None:
    """Claim `key` for this request (None: go ahead) or return the response to replay."""
    check_key(key)
    with session_scope(sessions) as session:
        claimed = session.execute(
            insert(IdempotencyKey)
            .values(
                id=uuid.uuid4(),
                tenant_id=tenant_id,
                scope=scope,
                key=key,
                fingerprint=fp,
                state="in_flight",
            )
            .on_conflict_do_nothing(index_elements=[IdempotencyKey.scope, IdempotencyKey.key])
            .returning(IdempotencyKey.id)
        ).scalar_one_or_none()
        if claimed is not None:
            return None
        row = session.scalars(
            select(IdempotencyKey)
            .where(IdempotencyKey.scope == scope, IdempotencyKey.key == key)
            .with_for_update()
        ).one()
        if row.fingerprint != fp:
            raise Unprocessable(
                "this Idempotency-Key was used with a different request",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        if row.state == "done":
            return StoredResponse(int(row.response_status or 200), row.response_body)
        now = session.execute(select(func.now())).scalar_one()
        if now - row.created_at < IN_FLIGHT_TIMEOUT:
            raise Conflict(
                "a request with this Idempotency-Key is still in progress",
                code="idempotency_key_in_use",
                param="Idempotency-Key",
            )
        row.created_at = now  # the first attempt died: this one takes over
        return None


def complete(sessions: sessionmaker[Session], scope: str, key: str, status: int, body: Any) -> None:
    """Store the response for replays."""
    with session_scope(sessions) as session:
        session.execute(
            update(IdempotencyKey)
            .where(IdempotencyKey.scope == scope, IdempotencyKey.key == key)
            .values(state="done", response_status=status, response_body=body)
        )


def release(sessions: sessionmaker[Session], scope: str, key: str) -> None:
    """Forget a claim whose request failed, so the client may retry with the same key."""
    with session_scope(sessions) as session:
        session.execute(
            delete(IdempotencyKey).where(
                IdempotencyKey.scope == scope,
                IdempotencyKey.key == key,
                IdempotencyKey.state == "in_flight",
            )
        )

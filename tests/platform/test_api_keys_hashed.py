"""API keys are stored hashed: the secret shown once appears in no column of its row (nor the
audit log), the row holds its sha256, and the secret alone finds the key."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from support.fixtures import cp_settings

from loraplex.platform.db.models import ApiKey, AuditLog
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services.api_keys import create_api_key, verify_api_key
from loraplex.platform.services.tenants import create_tenant

__all__ = ["cp_settings"]


def _columns(row: Any) -> list[str]:
    return [str(getattr(row, c.key)) for c in row.__table__.columns]


def test_only_a_hash_of_the_key_is_stored(cp_settings: Any) -> None:
    factory = make_sessionmaker(cp_settings.database_url)
    with session_scope(factory) as session:
        tenant = create_tenant(session, "hashed-keys")
        row, secret = create_api_key(session, tenant.id, "k")
        key_id = row.id
    with factory() as session:
        stored = session.get(ApiKey, key_id)
        assert stored is not None
        assert all(secret not in value for value in _columns(stored))
        assert stored.key_hash == hashlib.sha256(secret.encode()).hexdigest()
        for entry in session.scalars(select(AuditLog)):
            assert all(secret not in value for value in _columns(entry))
    with session_scope(factory) as session:
        found = verify_api_key(session, secret)
        assert found is not None and found.id == key_id
        assert verify_api_key(session, secret[:-1] + ("x" if secret[-1] != "x" else "y")) is None

"""The replica secret: how the gateway proves itself to replicas, and the per-tenant salt.

Replicas take requests only from holders of the shared secret (`LORAPLEX_REPLICA_SECRET`;
`loraplex up` makes one per data dir): the gateway sends `Authorization: Bearer <secret>`
and the replica compares it in constant time. The prefix-cache salt of a tenant is an HMAC
of its id under the same secret, so it cannot be guessed from the (visible) tenant id: only
the gateway can name a tenant's cache partition, and tenants never choose one.
"""

from __future__ import annotations

import hashlib
import hmac

_SALT_DOMAIN = b"loraplex-cache-salt-v1\0"


def bearer(secret: str) -> str:
    """The `Authorization` header value the gateway sends."""
    return f"Bearer {secret}"


def authorized(header: str | None, secret: str) -> bool:
    """True when `header` is `Bearer <secret>` (constant-time comparison)."""
    if not header or not secret:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), secret.encode())


def cache_salt(secret: str, tenant_id: str) -> str:
    """The prefix-cache salt of one tenant: HMAC-SHA256(secret, domain || tenant id), hex."""
    mac = hmac.new(secret.encode(), _SALT_DOMAIN + str(tenant_id).encode(), hashlib.sha256)
    return mac.hexdigest()

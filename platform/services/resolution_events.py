"""Tell every gateway that a tenant's adapters changed, so cached resolutions drop at once,
and that a version turned ready, so gateways warm the replicas its first request will use.

The gateways cache `model -> adapter version` answers for a short TTL, keyed by a per-tenant
generation counter in Redis (`GEN_KEY`, read by `gateway.resolve`). Whoever changes what a name
resolves to (a version turning ready or failed, an adapter deleted) calls
`adapters_changed` after its database write has committed.
"""

from __future__ import annotations

import logging
import uuid

import redis as sync_redis

from loraplex.platform.settings import Settings

log = logging.getLogger(__name__)

GEN_KEY = "loraplex:resolve:gen:{tenant}"
"""Redis key of a tenant's resolution generation (gateways cache resolutions under it)."""

READY_CHANNEL = "loraplex:adapters:ready"
"""Redis pub/sub channel: the id of each adapter version that turned ready (`gateway.warmer`)."""


def bump_generation(client: sync_redis.Redis, tenant_id: uuid.UUID | str) -> None:
    """Invalidate every cached resolution of `tenant_id` (call on any adapter change)."""
    client.incr(GEN_KEY.format(tenant=tenant_id))


def adapters_changed(
    settings: Settings, tenant_id: uuid.UUID | str, ready_version: uuid.UUID | None = None
) -> bool:
    """Bump the tenant's resolution generation (and announce `ready_version` on
    `READY_CHANNEL`); returns whether Redis took it.

    Best effort: without Redis, or when it is down, gateways still see the change within
    `resolve_cache_ttl_s` (and the version's first request fetches it), so a failure is logged
    rather than failing the caller's write.
    """
    url = settings.gateway_redis_url()
    if not url:
        return False
    client = sync_redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        bump_generation(client, tenant_id)
        if ready_version is not None:
            client.publish(READY_CHANNEL, str(ready_version))
        return True
    except sync_redis.RedisError as exc:
        log.warning("could not invalidate cached resolutions of tenant %s: %s", tenant_id, exc)
        return False
    finally:
        client.close()

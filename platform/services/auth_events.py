"""Tell every gateway that who may call, and how much, changed: a key revoked, a tenant
suspended, deleted or given new limits. Gateways cache verified keys (`gateway.key_cache`)
under one generation counter in Redis; a transaction that changes any of these marks its
session (`mark_auth_changed`), and the counter is bumped when that transaction commits, so
the next request anywhere verifies the key against the database again.
"""

from __future__ import annotations

import logging
import threading

import redis as sync_redis
from sqlalchemy import event
from sqlalchemy.orm import Session

from loraplex.platform.settings import Settings

log = logging.getLogger(__name__)

AUTH_GEN_KEY = "loraplex:auth:gen"
"""Redis key of the generation every gateway's cached key verifications are kept under."""

_FLAG = "loraplex_auth_changed"
_installed: set[str] = set()
_lock = threading.Lock()


def mark_auth_changed(session: Session) -> None:
    """Note that this transaction changes a key, a tenant's standing or its limits."""
    session.info[_FLAG] = True


def bump_auth_generation(settings: Settings) -> bool:
    """Invalidate every gateway's cached keys now; whether Redis took it (best effort: without
    it, gateways see the change within `api_key_cache_ttl_s`)."""
    url = settings.gateway_redis_url()
    if not url:
        return False
    client = sync_redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        client.incr(AUTH_GEN_KEY)
        return True
    except sync_redis.RedisError as exc:
        log.warning("could not invalidate cached API keys: %s", exc)
        return False
    finally:
        client.close()


def install_commit_hook(settings: Settings) -> None:
    """Bump the generation whenever a session of this process that `mark_auth_changed`
    commits (once per Redis URL and process)."""
    url = settings.gateway_redis_url() or ""
    with _lock:
        if url in _installed:
            return
        _installed.add(url)

    def after_commit(session: Session) -> None:
        if session.info.pop(_FLAG, False):
            bump_auth_generation(settings)

    def after_rollback(session: Session) -> None:
        session.info.pop(_FLAG, None)

    event.listen(Session, "after_commit", after_commit)
    event.listen(Session, "after_soft_rollback", lambda s, _t: after_rollback(s))

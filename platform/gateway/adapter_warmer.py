"""Warm the replicas a new adapter version's first request will go to, the moment the
version turns ready, so that request pays no fetch from object storage.

The validation worker announces each ready version on `READY_CHANNEL`
(`services.resolution_events`); every gateway listens, resolves the version as its tenant
would call it (`NAME:N`), asks its router for the best candidates (as for a request; up to
`warm_replicas` of them) and sends each `POST /adapters/warm`. Both `NAME:N` and `NAME` are
resolved on the way, so the first request finds its resolution cached. A replica fetches into its host
tier and never evicts for it (it answers "full" instead), so warming is bounded by the
replicas' adapter memory. The router then scores a warmed replica as near-resident, so the
first request goes where the weights are. Best effort throughout: a lost announcement or a
replica that does not answer only means the first request fetches, as without warming.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import Adapter, AdapterVersion
from loraplex.platform.gateway.replica_client import ReplicaClient
from loraplex.platform.gateway.resolve import ModelResolver, adapter_ref
from loraplex.platform.gateway.router import PromptKeys, Router
from loraplex.platform.services.resolution_events import READY_CHANNEL
from loraplex.platform.wire import GenerateRequest

log = logging.getLogger(__name__)
RETRY_S = 1.0  # pause before resubscribing after Redis went away
STOP_WAIT_S = 5.0


def _model_of(
    sessions: sessionmaker[Session], version_id: uuid.UUID
) -> tuple[uuid.UUID, str] | None:
    """(tenant, "NAME:N") of a ready version; None when it is not (any more)."""
    with sessions() as session:
        row = session.execute(
            select(AdapterVersion.tenant_id, Adapter.name, AdapterVersion.n)
            .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
            .where(
                AdapterVersion.id == version_id,
                AdapterVersion.status == "ready",
                Adapter.deleted_at.is_(None),
            )
        ).one_or_none()
    return None if row is None else (row[0], f"{row[1]}:{row[2]}")


class AdapterWarmer:
    """Listens for ready versions and warms them on the replicas the router would pick."""

    def __init__(
        self,
        redis: Redis,
        sessions: sessionmaker[Session],
        resolver: ModelResolver,
        router: Router,
        client: ReplicaClient,
        warm_replicas: int,
    ) -> None:
        self._redis = redis
        self._sessions = sessions
        self._resolver = resolver
        self._router = router
        self._client = client
        self._replicas = warm_replicas
        self._task: asyncio.Task[None] | None = None
        self._warms: set[asyncio.Task[list[str | None]]] = set()
        self.subscribed = asyncio.Event()

    def start(self) -> None:
        """Start listening (a no-op when `warm_replicas` is 0)."""
        if self._replicas > 0 and self._task is None:
            self._task = asyncio.create_task(self._listen())

    async def close(self) -> None:
        """Stop listening and drop warms in flight (bounded: a task stuck on a closed Redis or
        replica connection must not hold the app's shutdown)."""
        tasks = [t for t in (self._task, *self._warms) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)
        self._task = None

    async def _listen(self) -> None:
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(READY_CHANNEL)
                self.subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        version_id = uuid.UUID(message["data"].decode())
                    except (ValueError, AttributeError):
                        continue
                    task = asyncio.create_task(self.warm_version(version_id))
                    self._warms.add(task)
                    task.add_done_callback(self._warms.discard)
            except RedisError as exc:
                self.subscribed.clear()
                log.warning("adapter warming paused, Redis: %s", exc)
                await asyncio.sleep(RETRY_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def warm_version(self, version_id: uuid.UUID) -> list[str | None]:
        """Warm one ready version on up to `warm_replicas` replicas; their answers."""
        try:
            found = await asyncio.to_thread(_model_of, self._sessions, version_id)
            if found is None:
                return []
            tenant_id, model = found
            resolved = await self._resolver.resolve(self._sessions, tenant_id, model)
            # The bare name is what most first requests call: have its resolution cached too.
            with contextlib.suppress(Exception):
                await self._resolver.resolve(self._sessions, tenant_id, model.split(":")[0])
            ref, key = adapter_ref(resolved, tenant_id), resolved.adapter_key
            if ref is None or key is None:
                return []
            probe = GenerateRequest(request_id="warm", prompt_token_ids=[0])
            pool = await self._router.candidates(
                resolved.deployment_name,
                key,
                PromptKeys(probe, key),
                resolved.deployment_routes or None,
            )
            chosen = pool[: self._replicas]
            outcomes = await asyncio.gather(
                *(self._client.warm(c.replica.url, ref) for c in chosen)
            )
            for c, outcome in zip(chosen, outcomes, strict=True):
                if outcome in ("fetching", "on_host", "resident"):
                    self._router.note_warmed(c.replica.replica_id, key)
            log.info("warmed %s (%s) on %s", model, key[:12], list(outcomes))
            return list(outcomes)
        except Exception as exc:  # noqa: BLE001 - best effort: the first request fetches it
            log.warning("could not warm adapter version %s: %s", version_id, exc)
            return []


__all__ = ["AdapterWarmer"]

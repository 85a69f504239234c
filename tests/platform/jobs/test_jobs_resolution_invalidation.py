"""A change to what an adapter name resolves to is visible to a gateway's resolution cache at
once, not after its TTL: the validation job (ready or failed) and adapter deletion bump the
tenant's generation in Redis. The resolver here caches for 10 minutes, so only a bump can
refresh it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from support.uploads import service_uploader, upload_through_service

from loraplex.platform.db.models import Job
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.resolve import ModelResolver
from loraplex.platform.jobs.validate import run_validation
from loraplex.platform.services import adapters as svc
from loraplex.platform.services import objects
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment


def _validate(settings: Any, version_id: uuid.UUID) -> str:
    with make_sessionmaker(settings.database_url)() as s:
        job = s.scalars(select(Job).where(Job.subject_id == version_id)).one()
    return run_validation(settings, job.id)


def test_ready_failed_and_deleted_are_seen_at_once(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path
) -> None:
    settings = cp_settings
    up = service_uploader(settings, tenant_id, queue=f"idle-{uuid.uuid4().hex[:8]}")  # no worker
    sessions = make_sessionmaker(settings.database_url)
    with session_scope(sessions) as s:
        spec = DeploymentSpec(name=f"dep-{uuid.uuid4().hex[:6]}", base_model=base_model)
        create_deployment(s, settings, spec)

    async def main() -> None:
        redis = Redis.from_url(settings.gateway_redis_url())
        resolver = ModelResolver(redis, ttl_s=600.0)

        async def resolve(model: str) -> Any:
            return await resolver.resolve(sessions, tenant_id, model)

        try:
            v1 = await asyncio.to_thread(upload_through_service, up, "bot", base_model, adapter_r4)
            assert await asyncio.to_thread(_validate, settings, v1.id) == "ready"
            assert (await resolve("bot")).adapter_version == 1  # now cached for 10 minutes

            v2 = await asyncio.to_thread(upload_through_service, up, "bot", base_model, adapter_r4)
            assert await asyncio.to_thread(_validate, settings, v2.id) == "ready"
            assert (await resolve("bot")).adapter_version == 2

            # A failed version changes no answer, but it is a change: the generation moves.
            gen = await resolver.generation(tenant_id)
            v3 = await asyncio.to_thread(upload_through_service, up, "bot", base_model, adapter_r4)
            objects.s3_client(settings).delete_object(Bucket=settings.s3_bucket, Key=v3.weights_key)
            assert await asyncio.to_thread(_validate, settings, v3.id) == "failed"
            assert await resolver.generation(tenant_id) != gen
            assert (await resolve("bot")).adapter_version == 2

            await asyncio.to_thread(svc.delete_adapter, up, "bot")
            with pytest.raises(HttpError) as info:
                await resolve("bot")
            assert info.value.status == 404
        finally:
            await redis.aclose()

    asyncio.run(main())

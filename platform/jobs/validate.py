"""The validation job: read an adapter version's header by ranged GETs, check it against the
base model, stream its sha256, and end the version `ready` or `failed` with the reason.

Idempotent: it only acts on a version still `validating`, and the final write is conditional
on that status, so a re-delivered or re-enqueued job (after a worker died) is safe.

It always ends: anything that goes wrong while reading the tenant's files (not only a
refused adapter: any exception the checks raise) fails the version with a message; the job
has a time limit (`Settings.validation_time_limit_s`); storage outages are retried a bounded
number of times (`tasks.py`, and recovery's attempt cap) and then fail the version too.
"""

from __future__ import annotations

import logging
import uuid

from sqlalchemy import select, update

from loraplex.adapters.targets import resolve_targets
from loraplex.adapters.validation import (
    AdapterValidationError,
    ValidationResult,
    parse_config,
)
from loraplex.platform.db.models import (
    ADAPTER_CONFIG_FILE,
    Adapter,
    AdapterVersion,
    BaseModel,
    Job,
)
from loraplex.platform.db.session import session_scope
from loraplex.platform.jobs.adapter_checks import (
    finish_validation,
    heartbeater,
    inspect_files,
    safe_reason,
)
from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.services.deployments import max_lora_rank_for
from loraplex.platform.services.resolution_events import adapters_changed
from loraplex.platform.settings import Settings

log = logging.getLogger(__name__)


def _claim(settings: Settings, job_id: uuid.UUID) -> tuple[AdapterVersion, dict, int] | None:
    """Mark the job running; return (version, base config, rank limit), or None if nothing to do."""
    with session_scope(job_sessions(settings)) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.kind != records.VALIDATE or job.status in ("succeeded", "failed"):
            return None
        version = session.get(AdapterVersion, job.subject_id) if job.subject_id else None
        if version is None or version.status != "validating":
            records.finish(session, job, ok=True, outcome={"outcome": "skipped"})
            return None
        adapter = session.get(Adapter, version.adapter_id)
        base = session.get(BaseModel, adapter.base_model_id) if adapter else None
        if base is None:
            records.finish(session, job, ok=True, outcome={"outcome": "skipped"})
            return None
        job.status = "running"
        job.started_at = job.heartbeat_at = records.now()
        job.attempts = (job.attempts or 0) + 1
        limit = max_lora_rank_for(session, settings, base.id)
        return version, dict(base.config), limit


def run_validation(settings: Settings, job_id: uuid.UUID) -> str:
    """Validate the job's adapter version (or draft adapter: `validate_draft`); returns the
    outcome (ready, failed or skipped)."""
    from loraplex.platform.jobs.validate_draft import is_draft_job, run_draft_validation

    if is_draft_job(settings, job_id):
        return run_draft_validation(settings, job_id)
    claimed = _claim(settings, job_id)
    if claimed is None:
        return "skipped"
    version, base_config, max_rank = claimed
    try:
        result, digest, config_digest, size = inspect_files(
            settings, version, base_config, max_rank, heartbeater(settings, job_id)
        )
    except AdapterValidationError as exc:
        log.info("adapter version %s failed validation: %s", version.id, exc.reason)
        fail_version(settings, job_id, version, exc.reason, exc.code)
        return "failed"
    return _succeed(settings, job_id, version, result, digest, config_digest, size)


def _succeed(
    settings: Settings,
    job_id: uuid.UUID,
    version: AdapterVersion,
    result: ValidationResult,
    digest: str,
    config_digest: str,
    size: int,
) -> str:
    values = {
        "status": "ready",
        "error": None,
        "sha256": digest,
        "config_sha256": config_digest,
        "bytes": size,
        "rank": result.rank,
        "alpha": result.alpha,
        "use_rslora": result.use_rslora,
        "target_modules": result.target_modules,
        "targets": result.targets.to_json(),
    }
    outcome = {
        "outcome": "ready",
        "rank": result.rank,
        "tensor_count": result.tensor_count,
        "dtypes": result.dtypes,
        "modules": len(result.targets.modules),
    }
    if finish_validation(settings, job_id, AdapterVersion, version.id, values, outcome):
        adapters_changed(settings, version.tenant_id, ready_version=version.id)
    return "ready"


def fail_version(
    settings: Settings, job_id: uuid.UUID, version: AdapterVersion, reason: str, code: str
) -> bool:
    """End a validating version `failed` with `reason`; its objects are removed (a storage
    error there leaves them to the orphan reconciler, never the version stuck)."""
    written = finish_validation(
        settings,
        job_id,
        AdapterVersion,
        version.id,
        {"status": "failed", "error": reason, "sha256": None},  # no servable bytes
        {"outcome": "failed", "code": code},
    )
    if written:
        adapters_changed(settings, version.tenant_id)
        try:
            objects.delete_prefix(
                objects.s3_client(settings), settings.s3_bucket, version.object_prefix
            )
        except Exception:  # noqa: BLE001 - the version's state is final already
            log.warning("could not remove failed version %s's objects now", version.id)
    return written


def mark_transient_failure(settings: Settings, job_id: uuid.UUID, error: str, final: bool) -> None:
    """Record an infrastructure error; the version stays `validating` (re-runnable)."""
    with session_scope(job_sessions(settings)) as session:
        job = session.get(Job, job_id)
        if job is None:
            return
        if final:
            records.finish(session, job, ok=False, error=error)
        else:
            job.status = "queued"
            job.error = error


def backfill_targets(settings: Settings, limit: int = 100) -> list[uuid.UUID]:
    """Resolve the targets of `ready` versions validated before targets were recorded (the
    gateway hands replicas the resolved list; such a version could not be served without)."""
    factory = job_sessions(settings)
    with session_scope(factory) as session:
        rows = session.execute(
            select(AdapterVersion.id, AdapterVersion.object_prefix, BaseModel.config)
            .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
            .join(BaseModel, BaseModel.id == Adapter.base_model_id)
            .where(AdapterVersion.status == "ready", AdapterVersion.targets.is_(None))
            .limit(limit)
        ).all()
    done: list[uuid.UUID] = []
    client = objects.s3_client(settings) if rows else None
    for version_id, prefix, base_config in rows:
        try:
            raw = objects.read_all(
                client, settings.s3_bucket, prefix + ADAPTER_CONFIG_FILE, settings.max_config_bytes
            )
            targets = resolve_targets(parse_config(raw, settings.max_config_bytes), base_config)
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the others
            log.warning("cannot resolve targets of version %s: %s", version_id, safe_reason(exc))
            continue
        with session_scope(factory) as session:
            session.execute(
                update(AdapterVersion)
                .where(AdapterVersion.id == version_id, AdapterVersion.targets.is_(None))
                .values(targets=targets.to_json())
            )
        done.append(version_id)
    return done

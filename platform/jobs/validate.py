"""The validation job: read an adapter version's header by ranged GETs, check it against the
base model, stream its sha256, and end the version `ready` or `failed` with the reason.

Idempotent: it only acts on a version still `validating`, and the final write is conditional
on that status, so a re-delivered or re-enqueued job (after a worker died) is safe.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict

from sqlalchemy import update

from loraplex.adapters.validation import (
    AdapterValidationError,
    ValidationResult,
    check_tensors,
    header_length,
    parse_config,
    parse_weights_header,
)
from loraplex.platform.db.models import Adapter, AdapterVersion, BaseModel, Job
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.services.deployments import max_lora_rank_for
from loraplex.platform.services.resolution_events import adapters_changed
from loraplex.platform.settings import Settings

log = logging.getLogger(__name__)
HEARTBEAT_EVERY_S = 5.0


def _claim(settings: Settings, job_id: uuid.UUID) -> tuple[AdapterVersion, dict, int] | None:
    """Mark the job running; return (version, base config, rank limit), or None if nothing to do."""
    with session_scope(make_sessionmaker(settings.database_url)) as session:
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


def _inspect(
    settings: Settings,
    version: AdapterVersion,
    base_config: dict,
    max_rank: int,
    beat: Callable[[], None],
) -> tuple[ValidationResult, str, str, int]:
    """Do the checks against object storage; raises AdapterValidationError for a bad adapter."""
    client = objects.s3_client(settings)
    bucket = settings.s3_bucket
    size = objects.object_size(client, bucket, version.weights_key)
    if size is None:
        raise AdapterValidationError("adapter_model.safetensors was never uploaded", "missing_file")
    if size > settings.max_adapter_bytes:
        raise AdapterValidationError(
            f"adapter_model.safetensors is {size} bytes; at most {settings.max_adapter_bytes} "
            "are allowed",
            "too_large",
        )
    try:
        raw_config = objects.read_all(client, bucket, version.config_key, settings.max_config_bytes)
    except FileNotFoundError:
        raw_config = None
    except ValueError as exc:
        raise AdapterValidationError(f"adapter_config.json: {exc}", "config_too_large") from None
    config = parse_config(raw_config, settings.max_config_bytes)
    config_digest = hashlib.sha256(raw_config or b"").hexdigest()
    first8 = objects.read_range(client, bucket, version.weights_key, 0, min(8, size))
    n = header_length(first8, size, settings.max_safetensors_header_bytes)
    header_bytes = objects.read_range(client, bucket, version.weights_key, 8, n)
    header = parse_weights_header(header_bytes, size)
    result = check_tensors(config, header, base_config, max_rank)
    digest, total = objects.sha256_of(client, bucket, version.weights_key, on_chunk=beat)
    if total != size:
        raise AdapterValidationError(
            f"adapter_model.safetensors changed while validating ({total} != {size} bytes)",
            "changed",
        )
    return result, digest, config_digest, size


def _heartbeater(settings: Settings, job_id: uuid.UUID) -> Callable[[], None]:
    last = [time.monotonic()]

    def beat() -> None:
        if time.monotonic() - last[0] >= HEARTBEAT_EVERY_S:
            with session_scope(make_sessionmaker(settings.database_url)) as session:
                records.heartbeat(session, job_id)
            last[0] = time.monotonic()

    return beat


def _finish(
    settings: Settings, job_id: uuid.UUID, version_id: uuid.UUID, values: dict, outcome: dict
) -> bool:
    """Write the version's final state if still validating; returns whether it was written."""
    with session_scope(make_sessionmaker(settings.database_url)) as session:
        stmt = (
            update(AdapterVersion)
            .where(AdapterVersion.id == version_id, AdapterVersion.status == "validating")
            .values(**values)
        )
        written = session.execute(stmt).rowcount == 1
        job = session.get(Job, job_id)
        if job is not None:
            records.finish(session, job, ok=True, outcome={**outcome, "written": written})
        return written


def run_validation(settings: Settings, job_id: uuid.UUID) -> str:
    """Validate the job's adapter version; returns the outcome (ready, failed or skipped)."""
    claimed = _claim(settings, job_id)
    if claimed is None:
        return "skipped"
    version, base_config, max_rank = claimed
    try:
        result, digest, config_digest, size = _inspect(
            settings, version, base_config, max_rank, _heartbeater(settings, job_id)
        )
    except AdapterValidationError as exc:
        log.info("adapter version %s failed validation: %s", version.id, exc.reason)
        written = _finish(
            settings,
            job_id,
            version.id,
            {"status": "failed", "error": exc.reason},
            {"outcome": "failed", "code": exc.code},
        )
        if written:
            adapters_changed(settings, version.tenant_id)
            objects.delete_prefix(
                objects.s3_client(settings), settings.s3_bucket, version.object_prefix
            )
        return "failed"
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
    }
    if _finish(settings, job_id, version.id, values, {"outcome": "ready", **asdict(result)}):
        adapters_changed(settings, version.tenant_id)
    return "ready"


def mark_transient_failure(settings: Settings, job_id: uuid.UUID, error: str, final: bool) -> None:
    """Record an infrastructure error; the version stays `validating` (re-runnable)."""
    with session_scope(make_sessionmaker(settings.database_url)) as session:
        job = session.get(Job, job_id)
        if job is None:
            return
        if final:
            records.finish(session, job, ok=False, error=error)
        else:
            job.status = "queued"
            job.error = error

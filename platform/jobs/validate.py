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

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select, update

from loraplex.adapters.targets import resolve_targets
from loraplex.adapters.validation import (
    AdapterValidationError,
    ValidationResult,
    check_tensors,
    header_length,
    parse_config,
    parse_weights_header,
)
from loraplex.platform.db.models import (
    ADAPTER_CONFIG_FILE,
    Adapter,
    AdapterVersion,
    BaseModel,
    Job,
)
from loraplex.platform.db.session import rowcount, session_scope
from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.services.deployments import max_lora_rank_for
from loraplex.platform.services.resolution_events import adapters_changed
from loraplex.platform.settings import Settings

log = logging.getLogger(__name__)
HEARTBEAT_EVERY_S = 5.0


class ValidationTimeout(AdapterValidationError):
    """The job ran past its time limit."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(
            f"validation took longer than its limit of {limit_s:.0f} s and was stopped",
            "validation_timeout",
        )


def safe_reason(exc: BaseException, limit: int = 500) -> str:
    """`exc` as text for a message, never raising (str() of some values raises) and bounded."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - e.g. an int too large to print
        text = ""
    text = text[:limit] if text else type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, AdapterValidationError) else text


def _checked(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a check over tenant bytes: any failure other than a refusal becomes one."""
    try:
        return fn(*args)
    except AdapterValidationError:
        raise
    except Exception as exc:  # noqa: BLE001 - tenant data must never crash the job
        raise AdapterValidationError(
            f"the adapter could not be read: {safe_reason(exc)}", "invalid_adapter"
        ) from None


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
    config = _checked(parse_config, raw_config, settings.max_config_bytes)
    config_digest = hashlib.sha256(raw_config or b"").hexdigest()
    beat()
    first8 = objects.read_range(client, bucket, version.weights_key, 0, min(8, size))
    n = _checked(header_length, first8, size, settings.max_safetensors_header_bytes)
    header_bytes = objects.read_range(client, bucket, version.weights_key, 8, n)
    beat()
    header = _checked(parse_weights_header, header_bytes, size)
    beat()
    result = _checked(check_tensors, config, header, base_config, max_rank)
    beat()
    if version.sha256:
        # The direct upload hashed the bytes as it stored them: kept, not recomputed (each
        # replica checks the bytes it fetches against it). The size must still be the upload's.
        digest, total = version.sha256, size if version.bytes is None else version.bytes
    else:  # a presigned upload: these bytes never passed through the API
        digest, total = objects.sha256_of(client, bucket, version.weights_key, on_chunk=beat)
    if total != size:
        raise AdapterValidationError(
            f"adapter_model.safetensors changed while validating ({total} != {size} bytes)",
            "changed",
        )
    return result, digest, config_digest, size


def _heartbeater(settings: Settings, job_id: uuid.UUID) -> Callable[[], None]:
    """A function the job calls as it goes: heartbeats the job, enforces its time limit."""
    began = time.monotonic()
    last_box = [began]
    limit = settings.validation_time_limit_s

    def beat() -> None:
        now = time.monotonic()
        if now - began > limit:
            raise ValidationTimeout(limit)
        if now - last_box[0] >= HEARTBEAT_EVERY_S:
            with session_scope(job_sessions(settings)) as session:
                records.heartbeat(session, job_id)
            last_box[0] = time.monotonic()

    return beat


def _finish(
    settings: Settings, job_id: uuid.UUID, version_id: uuid.UUID, values: dict, outcome: dict
) -> bool:
    """Write the version's final state if still validating; returns whether it was written."""
    with session_scope(job_sessions(settings)) as session:
        stmt = (
            update(AdapterVersion)
            .where(AdapterVersion.id == version_id, AdapterVersion.status == "validating")
            .values(**values)
        )
        written = rowcount(session.execute(stmt)) == 1
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
    if _finish(settings, job_id, version.id, values, outcome):
        adapters_changed(settings, version.tenant_id, ready_version=version.id)
    return "ready"


def fail_version(
    settings: Settings, job_id: uuid.UUID, version: AdapterVersion, reason: str, code: str
) -> bool:
    """End a validating version `failed` with `reason`; its objects are removed (a storage
    error there leaves them to the orphan reconciler, never the version stuck)."""
    written = _finish(
        settings,
        job_id,
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

"""The checks a validation job runs over an uploaded adapter's files in object storage (a
version's, or a draft adapter's): the config, the bounded safetensors header, every tensor
against the model it is for, the sha256; and the job's heartbeat and time limit.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import update

from loraplex.adapters.validation import (
    AdapterValidationError,
    ValidationResult,
    check_tensors,
    header_length,
    parse_config,
    parse_weights_header,
)
from loraplex.platform.db.models import AdapterVersion, DraftAdapter, Job
from loraplex.platform.db.session import rowcount, session_scope
from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.settings import Settings

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


def inspect_files(
    settings: Settings,
    version: AdapterVersion | DraftAdapter,
    base_config: dict,
    max_rank: int,
    beat: Callable[[], None],
) -> tuple[ValidationResult, str, str, int]:
    """Do the checks against object storage, the tensors against `base_config` (a version's
    base model, a draft adapter's draft model); raises AdapterValidationError for a bad one."""
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


def heartbeater(settings: Settings, job_id: uuid.UUID) -> Callable[[], None]:
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


def finish_validation(
    settings: Settings,
    job_id: uuid.UUID,
    table: type[AdapterVersion] | type[DraftAdapter],
    row_id: uuid.UUID,
    values: dict[str, Any],
    outcome: dict[str, Any],
) -> bool:
    """Write a validated version's or draft adapter's final state if it is still validating
    (a rerun or a deletion may have moved it), and finish its job; whether it was written."""
    with session_scope(job_sessions(settings)) as session:
        stmt = (
            update(table).where(table.id == row_id, table.status == "validating").values(**values)
        )
        written = rowcount(session.execute(stmt)) == 1
        job = session.get(Job, job_id)
        if job is not None:
            records.finish(session, job, ok=True, outcome={**outcome, "written": written})
        return written

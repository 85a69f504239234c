"""The validation job of a draft adapter (issue 25): the same checks as an adapter version's
(`validate.inspect_files`: config, bounded safetensors header, every tensor's name, dtype and shape,
the sha256), but against the draft model the draft adapter is for, not the target's base model.

The draft model's `config.json` is read where the deployment's replicas load the draft model
from: an `s3://bucket/prefix` URL (with the platform's storage settings) or a local folder.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

from loraplex.adapters.validation import AdapterValidationError
from loraplex.platform.db.models import Adapter, AdapterVersion, DraftAdapter, Job
from loraplex.platform.db.session import session_scope
from loraplex.platform.jobs.adapter_checks import (
    finish_validation,
    heartbeater,
    inspect_files,
)
from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.services.deployments import max_lora_rank_for
from loraplex.platform.services.resolution_events import adapters_changed
from loraplex.platform.settings import Settings

log = logging.getLogger(__name__)
MAX_DRAFT_CONFIG_BYTES = 1 << 20
S3 = "s3://"


def draft_model_config(settings: Settings, location: str) -> dict[str, Any]:
    """The draft model's `config.json` (what its draft adapters are checked against); an
    AdapterValidationError naming the location when it cannot be read."""
    try:
        if location.startswith(S3):
            bucket, _, prefix = location[len(S3) :].partition("/")
            key = prefix.strip("/") + "/config.json" if prefix.strip("/") else "config.json"
            raw = objects.read_all(objects.s3_client(settings), bucket, key, MAX_DRAFT_CONFIG_BYTES)
        else:
            path = Path(location) / "config.json"
            if path.stat().st_size > MAX_DRAFT_CONFIG_BYTES:
                raise ValueError(f"larger than {MAX_DRAFT_CONFIG_BYTES} bytes")
            raw = path.read_bytes()
        config = json.loads(raw)
    except Exception as exc:  # noqa: BLE001 - any failure: the draft adapter cannot be checked
        raise AdapterValidationError(
            f"the draft model's config.json at {location!r} could not be read "
            f"({type(exc).__name__}: {str(exc)[:200]}); the draft adapter cannot be checked",
            "draft_model_unreadable",
        ) from None
    if not isinstance(config, dict):
        raise AdapterValidationError(
            f"the draft model's config.json at {location!r} is not a JSON object",
            "draft_model_unreadable",
        )
    return config


def is_draft_job(settings: Settings, job_id: uuid.UUID) -> bool:
    """Whether the validation job `job_id` validates a draft adapter (not a version)."""
    from loraplex.platform.services.draft_adapters import DRAFT_JOB

    with session_scope(job_sessions(settings)) as session:
        job = session.get(Job, job_id)
        return job is not None and (job.payload or {}).get("subject") == DRAFT_JOB


def _claim(settings: Settings, job_id: uuid.UUID) -> tuple[DraftAdapter, int] | None:
    """Mark the job running; (the draft adapter, its rank limit), or None if nothing to do."""
    with session_scope(job_sessions(settings)) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.kind != records.VALIDATE or job.status in ("succeeded", "failed"):
            return None
        row = session.get(DraftAdapter, job.subject_id) if job.subject_id else None
        version = session.get(AdapterVersion, row.adapter_version_id) if row else None
        adapter = session.get(Adapter, version.adapter_id) if version else None
        if row is None or adapter is None or row.status != "validating":
            records.finish(session, job, ok=True, outcome={"outcome": "skipped"})
            return None
        job.status = "running"
        job.started_at = job.heartbeat_at = records.now()
        job.attempts = (job.attempts or 0) + 1
        limit = max_lora_rank_for(session, settings, adapter.base_model_id)
        session.expunge(row)
        return row, limit


def run_draft_validation(settings: Settings, job_id: uuid.UUID) -> str:
    """Validate the job's draft adapter against its draft model; the outcome (ready, failed
    or skipped). A ready one is tied to its target at the gateway's next resolution."""
    claimed = _claim(settings, job_id)
    if claimed is None:
        return "skipped"
    row, max_rank = claimed
    try:
        config = draft_model_config(settings, row.draft_model)
        result, digest, config_digest, size = inspect_files(
            settings, row, config, max_rank, heartbeater(settings, job_id)
        )
    except AdapterValidationError as exc:
        log.info("draft adapter %s failed validation: %s", row.id, exc.reason)
        written = finish_validation(
            settings,
            job_id,
            DraftAdapter,
            row.id,
            {"status": "failed", "error": exc.reason, "sha256": None},
            {"outcome": "failed", "code": exc.code},
        )
        if written:
            try:
                objects.delete_prefix(
                    objects.s3_client(settings), settings.s3_bucket, row.object_prefix
                )
            except Exception:  # noqa: BLE001 - the row's state is final already
                log.warning("could not remove failed draft adapter %s's objects now", row.id)
        return "failed"
    values = {
        "status": "ready",
        "error": None,
        "sha256": digest,
        "config_sha256": config_digest,
        "bytes": size,
        "rank": result.rank,
        "alpha": result.alpha,
        "targets": result.targets.to_json(),
    }
    outcome = {"outcome": "ready", "rank": result.rank, "modules": len(result.targets.modules)}
    if finish_validation(settings, job_id, DraftAdapter, row.id, values, outcome):
        adapters_changed(settings, row.tenant_id)
    return "ready"

"""Validation always ends: whatever a tenant's files hold, the version leaves `validating`
with a message, in bounded time; a version whose jobs keep dying is failed, not re-queued."""

from __future__ import annotations

import io
import json
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from support.uploads import adapter_files

from loraplex.platform.db.models import AdapterVersion, Job
from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.jobs.adapter_checks import ValidationTimeout, heartbeater
from loraplex.platform.jobs.recovery import requeue_stale_validations
from loraplex.platform.jobs.validate import run_validation
from loraplex.platform.services import adapters as svc
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects

NAME = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


class _Nowhere:
    """A dispatcher that sends nothing: the test runs the job itself."""

    def __init__(self) -> None:
        self.sent: list[uuid.UUID] = []

    def send(self, kind: str, job_id: uuid.UUID) -> None:
        self.sent.append(job_id)


def _safetensors(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _validate(cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
              *, config: bytes | None = None, weights: bytes | None = None,
              settings: Any | None = None) -> AdapterVersion:  # fmt: skip
    """Upload the good adapter, swap in hostile bytes, run the job in-process."""
    good_config, good_weights = adapter_files(adapter_r4)
    up = svc.Uploader(
        settings=cp_settings,
        sessions=make_sessionmaker(cp_settings.database_url),
        dispatcher=_Nowhere(),
        tenant_id=tenant_id,
        actor="test",
    )
    name = f"hostile-{uuid.uuid4().hex[:8]}"
    version = svc.upload_adapter(
        up, name, base_model, good_config, io.BytesIO(good_weights), len(good_weights)
    )
    client = objects.s3_client(cp_settings)
    if config is not None:
        objects.put_bytes(client, cp_settings.s3_bucket, version.config_key, config)
    if weights is not None:
        objects.put_bytes(client, cp_settings.s3_bucket, version.weights_key, weights)
    (job_id,) = up.dispatcher.sent
    began = time.monotonic()
    outcome = run_validation(settings or cp_settings, job_id)
    assert time.monotonic() - began < 30
    with make_sessionmaker(cp_settings.database_url)() as s:
        row = s.get(AdapterVersion, version.id)
        assert row is not None
        assert outcome == row.status == "failed", (outcome, row.status, row.error)
        return row


def test_element_count_too_large_to_print_fails_the_version(
    cp_settings, base_model, tenant_id, adapter_r4
) -> None:
    # 8 dims of 10**600: the product has 4,800 digits; printing it raises in Python.
    weights = _safetensors({NAME: {"dtype": "F32", "shape": [10**600] * 8, "data_offsets": [0, 4]}},
                           b"\0" * 4)  # fmt: skip
    row = _validate(cp_settings, base_model, tenant_id, adapter_r4, weights=weights)
    assert "shape" in (row.error or "")


def test_a_header_of_many_dimensions_fails_fast(
    cp_settings, base_model, tenant_id, adapter_r4
) -> None:
    shape = [10**18] * 100_000
    weights = _safetensors(
        {NAME: {"dtype": "F32", "shape": shape, "data_offsets": [0, 4]}}, b"\0" * 4
    )
    row = _validate(cp_settings, base_model, tenant_id, adapter_r4, weights=weights)
    assert "at most 8" in (row.error or "")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"rank_pattern": {"(?i)q_proj": 2}}, "rank_pattern key"),
        ({"layers_to_transform": [0], "layers_pattern": "layers("}, "layers_pattern"),
        ({"target_modules": r"model\.layers\.0\.self_attn\.q_proj|(.+)+X"}, "target_modules"),
    ],
)
def test_patterns_a_replica_could_choke_on_fail_the_version_clearly(
    cp_settings, base_model, tenant_id, adapter_r4, extra, words
) -> None:
    config = json.loads(adapter_files(adapter_r4)[0]) | extra
    row = _validate(
        cp_settings, base_model, tenant_id, adapter_r4, config=json.dumps(config).encode()
    )
    assert words in (row.error or ""), row.error


def test_the_job_has_a_time_limit(cp_settings, base_model, tenant_id, adapter_r4) -> None:
    quick = cp_settings.model_copy(update={"validation_time_limit_s": 0.0})
    row = _validate(cp_settings, base_model, tenant_id, adapter_r4, settings=quick)
    assert "longer than its limit" in (row.error or "")


def test_a_phase_that_runs_long_is_cut_off(cp_settings) -> None:
    """The limit is checked at every beat of every phase, not only the first: a phase that
    keeps beating past the limit is stopped there (the hash of a slow download, say)."""
    beat = heartbeater(
        cp_settings.model_copy(update={"validation_time_limit_s": 0.3}), uuid.uuid4()
    )
    beat()  # within the limit
    time.sleep(0.1)
    beat()
    time.sleep(0.3)
    with pytest.raises(ValidationTimeout, match="longer than its limit"):
        beat()


def test_recovery_gives_up_after_bounded_attempts(
    cp_settings, base_model, tenant_id, adapter_r4
) -> None:
    config, weights = adapter_files(adapter_r4)
    dispatcher = _Nowhere()
    up = svc.Uploader(
        settings=cp_settings,
        sessions=make_sessionmaker(cp_settings.database_url),
        dispatcher=dispatcher,
        tenant_id=tenant_id,
        actor="test",
    )
    version = svc.upload_adapter(up, "dies", base_model, config, io.BytesIO(weights), len(weights))
    factory = make_sessionmaker(cp_settings.database_url)
    for attempt in range(cp_settings.validation_max_attempts + 1):
        with factory() as s, s.begin():
            for job in s.scalars(select(Job).where(Job.subject_id == version.id)):
                if job.status in ("queued", "running"):  # its worker died with an error
                    records.finish(s, job, ok=False, error=f"OSError: boom {attempt}")
        sent = requeue_stale_validations(cp_settings, dispatcher, older_than_s=0)
        if attempt + 1 < cp_settings.validation_max_attempts:
            assert len(sent) == 1, attempt
    with factory() as s:
        row = s.get(AdapterVersion, version.id)
        jobs = s.scalars(select(Job).where(Job.subject_id == version.id)).all()
    assert row.status == "failed" and "after 3 attempts" in row.error
    # The tenant reads a stable reason and a job id to report, never the job's own error
    # text (which can name hosts, buckets and keys).
    assert "internal_error" in row.error and "boom" not in row.error
    assert "OSError" not in row.error
    assert any(str(j.id) in row.error for j in jobs)
    assert len(jobs) == cp_settings.validation_max_attempts

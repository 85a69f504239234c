"""The validation job on a real Celery worker: a worker killed mid-job leaves the version
re-runnable (recovery re-enqueues it and it reaches `ready`), lost messages are re-sent,
abandoned uploads expire, and the jobs are idempotent."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select
from support.control_plane import running_worker
from support.uploads import adapter_files, service_uploader, upload_through_service
from support.waiting import wait_until

from loraplex.platform.db.models import AdapterVersion, Job
from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.jobs.delete import run_delete
from loraplex.platform.jobs.recovery import expire_abandoned_uploads, recover
from loraplex.platform.jobs.validate import run_validation
from loraplex.platform.services import adapters as svc
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects


def _version(settings: Any, version_id: uuid.UUID) -> AdapterVersion:
    with make_sessionmaker(settings.database_url)() as s:
        v = s.get(AdapterVersion, version_id)
        assert v is not None
        return v


def _jobs(settings: Any, version_id: uuid.UUID) -> list[Job]:
    with make_sessionmaker(settings.database_url)() as s:
        return list(
            s.scalars(select(Job).where(Job.subject_id == version_id).order_by(Job.created_at))
        )


def _worker_env(settings: Any, s3_endpoint: str) -> dict[str, str]:
    return {
        **os.environ,
        "LORAPLEX_DATABASE_URL": settings.database_url,
        "LORAPLEX_S3_ENDPOINT_URL": s3_endpoint,
        "LORAPLEX_S3_BUCKET": settings.s3_bucket,
        "LORAPLEX_S3_ACCESS_KEY": settings.s3_access_key,
        "LORAPLEX_S3_SECRET_KEY": settings.s3_secret_key,
        "LORAPLEX_BROKER_URL": settings.broker_url,
        "LORAPLEX_CELERY_QUEUE": settings.celery_queue,
    }


def test_worker_killed_mid_job_leaves_version_rerunnable(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path, tmp_path: Path
) -> None:
    # An S3 endpoint that accepts connections but never answers: the worker's job blocks
    # mid-way (after claiming the job, while reading the header), and we kill it there.
    stall = socket.socket()
    stall.bind(("127.0.0.1", 0))
    stall.listen(64)
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "loraplex.platform.jobs.worker"],
        env=_worker_env(cp_settings, f"http://127.0.0.1:{stall.getsockname()[1]}"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        version = upload_through_service(
            service_uploader(cp_settings, tenant_id), "killed", base_model, adapter_r4
        )
        wait_until(
            lambda: any(j.status == "running" for j in _jobs(cp_settings, version.id)),
            timeout=120,
            what="the worker to start the job",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        stall.close()
        log.close()
    assert _version(cp_settings, version.id).status == "validating"
    (job,) = _jobs(cp_settings, version.id)
    assert job.status == "running"

    up = service_uploader(cp_settings, tenant_id)
    with running_worker(cp_settings):
        # not stale yet under the default threshold: nothing is requeued
        assert recover(cp_settings, up.dispatcher).requeued_versions == []
        report = recover(cp_settings, up.dispatcher, older_than_s=0)
        assert len(report.requeued_versions) == 1
        wait_until(
            lambda: _version(cp_settings, version.id).status == "ready",
            timeout=60,
            what="the requeued validation",
        )
    done = _version(cp_settings, version.id)
    _, weights = adapter_files(adapter_r4)
    assert done.sha256 == hashlib.sha256(weights).hexdigest() and done.rank == 4
    old, new = _jobs(cp_settings, version.id)
    assert old.status == "failed" and "stale" in (old.error or "")
    assert new.status == "succeeded" and new.payload["outcome"] == "ready"
    # re-delivering either job again changes nothing
    assert run_validation(cp_settings, old.id) == "skipped"
    assert run_validation(cp_settings, new.id) == "skipped"
    assert _version(cp_settings, version.id).updated_at == done.updated_at


def test_lost_message_is_resent(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path
) -> None:
    # the job goes to a queue no worker reads: as if the broker lost the message
    lost = service_uploader(cp_settings, tenant_id, queue=f"nobody-{uuid.uuid4().hex[:6]}")
    version = upload_through_service(lost, "lost", base_model, adapter_r4)
    up = service_uploader(cp_settings, tenant_id)
    with running_worker(cp_settings):
        assert _version(cp_settings, version.id).status == "validating"
        assert recover(cp_settings, up.dispatcher, older_than_s=0).requeued_versions
        wait_until(
            lambda: _version(cp_settings, version.id).status == "ready",
            timeout=60,
            what="the re-sent validation",
        )


def test_a_job_rerun_on_a_finished_version_is_a_no_op(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path
) -> None:
    up = service_uploader(cp_settings, tenant_id, queue=f"nobody-{uuid.uuid4().hex[:6]}")
    version = upload_through_service(up, "direct", base_model, adapter_r4)
    (job,) = _jobs(cp_settings, version.id)
    assert run_validation(cp_settings, job.id) == "ready"  # run in-process, same code path
    before = _version(cp_settings, version.id)
    with make_sessionmaker(cp_settings.database_url)() as s, s.begin():
        extra = records.create_job(s, records.VALIDATE, tenant_id=tenant_id, subject_id=version.id)
    assert run_validation(cp_settings, extra.id) == "skipped"
    assert _version(cp_settings, version.id).updated_at == before.updated_at


def test_abandoned_upload_expires_and_leaves_no_objects(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path
) -> None:
    config, weights = adapter_files(adapter_r4)
    up = service_uploader(cp_settings, tenant_id)
    version, _plan = svc.start_presigned_upload(up, "abandoned", base_model, config, len(weights))
    client = objects.s3_client(cp_settings)
    assert objects.list_keys(client, cp_settings.s3_bucket, version.object_prefix)
    assert expire_abandoned_uploads(cp_settings) == []  # not old enough yet
    assert expire_abandoned_uploads(cp_settings, older_than_s=0) == [version.id]
    v = _version(cp_settings, version.id)
    assert v.status == "failed" and "not completed" in (v.error or "")
    assert objects.list_keys(client, cp_settings.s3_bucket, version.object_prefix) == []
    uploads = (
        client.list_multipart_uploads(
            Bucket=cp_settings.s3_bucket, Prefix=version.object_prefix
        ).get("Uploads")
        or []
    )
    assert uploads == []


def test_delete_job_is_idempotent(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path
) -> None:
    up = service_uploader(cp_settings, tenant_id, queue=f"nobody-{uuid.uuid4().hex[:6]}")
    version = upload_through_service(up, "del", base_model, adapter_r4)
    adapter, job_id = svc.delete_adapter(up, "del")
    prefix = svc.adapter_prefix(tenant_id, adapter.id)
    client = objects.s3_client(cp_settings)
    assert len(objects.list_keys(client, cp_settings.s3_bucket, prefix)) == 2
    assert run_delete(cp_settings, job_id) == 2
    assert objects.list_keys(client, cp_settings.s3_bucket, prefix) == []
    assert run_delete(cp_settings, job_id) == 0
    with make_sessionmaker(cp_settings.database_url)() as s:
        assert s.get(AdapterVersion, version.id) is None

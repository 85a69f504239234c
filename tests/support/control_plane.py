"""A control plane for one test module over the session's real services: a fresh migrated
database, a fresh bucket and a private Celery queue (`control_plane`), a real worker
(`running_worker`), and the database helpers the other stacks use."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy.engine import make_url


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(pg_url: str, label: str) -> str:
    """Create an empty database next to `pg_url`'s; return its SQLAlchemy URL."""
    name = f"lp_{''.join(c for c in label.lower() if c.isalnum())[:30]}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_libpq(pg_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(pg_url).set(database=name).render_as_string(hide_password=False)


def fresh_database(pg_url: str, label: str = "fresh") -> str:
    """`create_database`, migrated to head."""
    from loraplex.platform.db.migrate import upgrade

    url = create_database(pg_url, label)
    upgrade(url)
    return url


def drop_database(pg_url: str, url: str) -> None:
    """Drop a database made by `create_database` (closing our pooled connections first)."""
    from loraplex.platform.db.session import dispose_engine

    dispose_engine(url)
    name = make_url(url).database
    with psycopg.connect(_libpq(pg_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def empty_bucket(s3_client: Any, bucket: str) -> None:
    """Delete every object (and unfinished upload) in a bucket, then the bucket."""
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3_client.delete_object(Bucket=bucket, Key=obj["Key"])
    for up in s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) or []:
        s3_client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    s3_client.delete_bucket(Bucket=bucket)


@contextmanager
def control_plane(
    pg_url: str, settings: Any, s3_client: Any, label: str, **overrides: Any
) -> Iterator[Any]:
    """Settings over a fresh migrated database, a fresh bucket and a private Celery queue."""
    url = fresh_database(pg_url, label)
    bucket = f"lp-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    try:
        yield settings.model_copy(
            update={
                "database_url": url,
                "s3_bucket": bucket,
                "celery_queue": f"lp-test-{uuid.uuid4().hex[:8]}",
                **overrides,
            }
        )
    finally:
        drop_database(pg_url, url)
        empty_bucket(s3_client, bucket)


@contextmanager
def running_worker(settings: Any) -> Iterator[Any]:
    """A real Celery worker (solo pool, in a thread) consuming `settings`' queue."""
    from celery.contrib.testing.worker import start_worker

    from loraplex.platform.jobs.celery_app import create_celery

    app = create_celery(settings)
    with start_worker(
        app, pool="solo", perform_ping_check=False, shutdown_timeout=30, loglevel="WARNING"
    ) as worker:
        yield worker


def tenant_keys(s3_client: Any, bucket: str, tenant_id: str) -> list[str]:
    """Every object key stored for a tenant."""
    keys = []
    for page in s3_client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"tenants/{tenant_id}/"
    ):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys

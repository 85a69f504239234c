"""The embedded services start, keep their data across a restart, stop cleanly, and the
session fixtures built on them hand out working connections."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from loraplex.platform.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedSeaweedFS,
    EmbeddedServiceError,
)
from loraplex.platform.embedded.process import ServiceProcess, pick_ports


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); its /proc state says Z.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_postgres_restart_keeps_rows_and_stop_ends_process(service_tmp_path: Path) -> None:
    tmp_path = service_tmp_path
    server = EmbeddedPostgres(tmp_path / "pg", durable=False)
    url = server.start()
    assert url.startswith("postgresql+psycopg://loraplex:")
    assert "@127.0.0.1:" in url
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE kept (x int)"))
        conn.execute(sa.text("INSERT INTO kept VALUES (42)"))
    engine.dispose()
    pid = server.process.pid
    server.stop()
    assert pid is not None and _gone(pid)

    again = EmbeddedPostgres(tmp_path / "pg", durable=False)
    url2 = again.start()
    try:
        engine = sa.create_engine(url2)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT x FROM kept")).scalar_one() == 42
        engine.dispose()
        # TCP clients must authenticate: a wrong password is refused.
        bad = sa.create_engine(url2.replace(":" + url2.split(":")[2].split("@")[0] + "@", ":nope@"))
        with pytest.raises(sa.exc.OperationalError):
            bad.connect()
        bad.dispose()
    finally:
        again.stop()


def test_redis_restart_keeps_keys(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", durable=True)
    client = redis.Redis.from_url(server.start())
    client.set("kept", "yes")
    client.close()
    pid = server.process.pid
    server.stop()
    assert pid is not None and _gone(pid)

    again = EmbeddedRedis(tmp_path / "redis", durable=True)
    client = redis.Redis.from_url(again.start())
    try:
        assert client.get("kept") == b"yes"
    finally:
        client.close()
        again.stop()


def test_seaweedfs_restart_keeps_objects_and_checks_keys(tmp_path: Path) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    def client(endpoint: str, key: str, secret: str):
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    server = EmbeddedSeaweedFS(tmp_path / "s3", access_key="ak-test", secret_key="sk-test")
    endpoint = server.start()
    s3 = client(endpoint, "ak-test", "sk-test")
    s3.create_bucket(Bucket="kept-bucket")
    s3.put_object(Bucket="kept-bucket", Key="a/b.bin", Body=b"0123456789")
    with pytest.raises(ClientError):
        client(endpoint, "ak-test", "wrong-secret").list_buckets()
    pid = server.process.pid
    server.stop()
    assert pid is not None and _gone(pid)

    again = EmbeddedSeaweedFS(tmp_path / "s3", access_key="ak-test", secret_key="sk-test")
    endpoint2 = again.start()
    try:
        s3 = client(endpoint2, "ak-test", "sk-test")
        got = s3.get_object(Bucket="kept-bucket", Key="a/b.bin", Range="bytes=2-5")
        assert got["Body"].read() == b"2345"
    finally:
        again.stop()


def test_saved_ports_are_reused_when_free(tmp_path: Path) -> None:
    first = pick_ports(tmp_path / "ports.json", ["a", "b"])
    assert first["a"] != first["b"]
    assert pick_ports(tmp_path / "ports.json", ["a", "b"]) == first


def test_startup_failure_reports_the_log(tmp_path: Path) -> None:
    proc = ServiceProcess("doomed", tmp_path / "doomed.log")
    proc.start(["sh", "-c", "echo boom-marker >&2; exit 3"])
    with pytest.raises(EmbeddedServiceError, match="boom-marker"):
        proc.wait_ready(lambda: False, timeout=10)


def test_session_fixtures_work(settings, s3_client, s3_prefix: str) -> None:
    engine = sa.create_engine(settings.database_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    engine.dispose()
    key = s3_prefix + "hello.txt"
    s3_client.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"hi")
    assert s3_client.get_object(Bucket=settings.s3_bucket, Key=key)["Body"].read() == b"hi"
    r = redis.Redis.from_url(settings.broker_url)
    assert r.ping()
    r.close()
    assert settings.admin_key
    assert s3_prefix.startswith("tests/") and s3_prefix.endswith("/")

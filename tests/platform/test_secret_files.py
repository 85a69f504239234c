"""Secrets at rest: created 0600 from their first byte (no chmod after a write, whatever the
umask), kept across restarts, random per data dir for the embedded S3 and Redis, and handed
only to the children that need them."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from loraplex.platform.child_env import child_env
from loraplex.platform.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedSeaweedFS
from loraplex.platform.secret_files import read_or_create_secret
from loraplex.platform.settings import Settings
from loraplex.platform.up import admin_key


@pytest.fixture
def no_chmod_wide_umask(monkeypatch: pytest.MonkeyPatch):
    """Umask 000 (a file made world-readable stays so) and no chmod allowed at all."""

    def refuse(*_a, **_k):
        raise AssertionError("a secret file was chmod-ed after it was written")

    monkeypatch.setattr(os, "chmod", refuse)
    monkeypatch.setattr(Path, "chmod", refuse)
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_secret_files_are_born_0600(tmp_path: Path, no_chmod_wide_umask) -> None:
    key = admin_key(Settings(admin_key=None), tmp_path)
    assert key.startswith("lpx-admin-") and _mode(tmp_path / "admin_key") == 0o600
    assert admin_key(Settings(admin_key=None), tmp_path) == key  # kept
    pg = EmbeddedPostgres(tmp_path / "pg")
    made = pg.password  # made on first use
    assert _mode(tmp_path / "pg" / "password") == 0o600
    assert (tmp_path / "pg" / "password").read_text().strip() == made == pg.password
    assert EmbeddedPostgres(tmp_path / "pg").password == pg.password  # kept across starts
    assert EmbeddedPostgres(tmp_path / "pg2").password != pg.password  # per data dir
    redis = EmbeddedRedis(tmp_path / "redis")
    assert _mode(tmp_path / "redis" / "password") == 0o600
    s3 = EmbeddedSeaweedFS(tmp_path / "s3")
    for name in ("s3-access-key", "s3-secret-key"):
        assert _mode(tmp_path / "s3" / name) == 0o600
    assert EmbeddedRedis(tmp_path / "redis").password == redis.password
    assert EmbeddedSeaweedFS(tmp_path / "s3").secret_key == s3.secret_key


def test_embedded_credentials_are_random_per_data_dir(tmp_path: Path) -> None:
    a, b = EmbeddedSeaweedFS(tmp_path / "a"), EmbeddedSeaweedFS(tmp_path / "b")
    defaults = Settings()
    assert a.secret_key != b.secret_key and a.access_key != b.access_key
    assert a.secret_key != defaults.s3_secret_key and len(a.secret_key) >= 32
    assert EmbeddedRedis(tmp_path / "a").password != EmbeddedRedis(tmp_path / "b").password
    assert ":" + EmbeddedRedis(tmp_path / "a").password + "@" in _redis_url(tmp_path / "a")


def _redis_url(data_dir: Path) -> str:
    server = EmbeddedRedis(data_dir)
    server.port = 6399  # not started: only the URL's shape is checked
    return server.url


def test_concurrent_creators_agree(tmp_path: Path) -> None:
    seen: list[str] = []
    threads = [
        threading.Thread(
            target=lambda i=i: seen.append(read_or_create_secret(tmp_path / "s", lambda: f"v{i}"))
        )
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1 and not [p for p in tmp_path.iterdir() if p.name != "s"]


def test_each_child_gets_only_its_secrets() -> None:
    settings = Settings(
        admin_key="adm", database_url="postgresql+psycopg://u:pw@h/db", broker_url="redis://:x@h",
        s3_endpoint_url="http://s3", s3_secret_key="s3s", max_concurrent_uploads=3,
    )  # fmt: skip
    inherited = {"PATH": "/bin", "LORAPLEX_ADMIN_KEY": "leaked", "LORAPLEX_OTHER_TOKEN": "t"}
    api, worker, engine = (child_env(settings, r, inherited) for r in ("api", "worker", "engine"))
    assert api["LORAPLEX_ADMIN_KEY"] == "adm" and api["PATH"] == "/bin"
    assert "LORAPLEX_ADMIN_KEY" not in worker and worker["LORAPLEX_DATABASE_URL"].endswith("/db")
    for secret in ("ADMIN_KEY", "DATABASE_URL", "BROKER_URL", "OTHER_TOKEN"):
        assert f"LORAPLEX_{secret}" not in engine, secret
    assert engine["LORAPLEX_S3_SECRET_KEY"] == "s3s" and engine["LORAPLEX_S3_ENDPOINT_URL"]
    assert engine["LORAPLEX_MAX_CONCURRENT_UPLOADS"] == "3"  # non-secret settings reach all
    with pytest.raises(ValueError, match="unknown child role"):
        child_env(settings, "console", inherited)

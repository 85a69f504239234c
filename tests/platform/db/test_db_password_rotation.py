"""Rotating the database password under a running API is not an outage: the API's database
URL names a password file (a mounted Secret), every new connection reads it, and a connection
refused for its password waits for the file to change. The rotation here is RDS's order of
events (password changed on the server first; the pod's mounted Secret follows after a lag),
with the API's open connections killed in the middle so that new ones are needed at once.
Every request is retried once at most: no request may fail twice in a row.

Control: the same rotation against an API whose URL holds the password (today's layout) leaves
it failing request after request."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url
from support.control_plane import _libpq

from loraplex.platform.db.migrate import upgrade
from loraplex.platform.local_processes import start_api_process

ADMIN = "lpx-admin-rotation-test"


def _sql(pg_url: str, statement: str) -> None:
    with psycopg.connect(_libpq(pg_url), autocommit=True) as conn:
        conn.execute(statement)


def _kill_backends(pg_url: str, role: str) -> None:
    _sql(pg_url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")


def _write_atomically(path: Path, text: str) -> None:
    """As the kubelet updates a mounted Secret: a new file renamed over the old one."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


class Load:
    """Requests in a loop, each retried once on failure; records failed attempts."""

    def __init__(self, url: str) -> None:
        self.url, self.ok, self.failed, self.failed_twice = url, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _get(self, client: httpx.Client) -> bool:
        try:
            return client.get("/admin/v1/tenants").status_code == 200
        except httpx.HTTPError:
            return False

    def _run(self) -> None:
        headers = {"authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=60) as client:
            while not self._stop.is_set():
                if self._get(client):
                    self.ok += 1
                    continue
                self.failed += 1
                if self._get(client):
                    self.ok += 1
                else:
                    self.failed_twice += 1
                    time.sleep(0.05)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def _rotate(pg_url: str, role: str, password_file: Path | None) -> None:
    """Change the role's password on the server, kill its connections, and only a second
    later update the pod's copy (when there is one), then kill them once more."""
    _sql(pg_url, f"ALTER ROLE {role} PASSWORD 'second-{role}'")
    _kill_backends(pg_url, role)
    time.sleep(1.0)
    if password_file is not None:
        _write_atomically(password_file, f"second-{role}\n")
    time.sleep(1.0)
    _kill_backends(pg_url, role)
    time.sleep(1.0)


def _api(pg_url: str, tmp_path: Path, *, with_file: bool) -> tuple[str, str, object, Path | None]:
    role = f"rot_{uuid.uuid4().hex[:8]}"
    _sql(pg_url, f"CREATE ROLE {role} LOGIN PASSWORD 'first-{role}'")
    _sql(pg_url, f'CREATE DATABASE "{role}" OWNER {role}')
    base = make_url(pg_url).set(username=role, database=role)
    password_file = None
    if with_file:
        password_file = tmp_path / f"{role}-password"
        _write_atomically(password_file, f"first-{role}\n")
        url = base.set(password=None).render_as_string(hide_password=False)
        url += f"?password_file={quote(str(password_file))}"
    else:
        url = base.set(password=f"first-{role}").render_as_string(hide_password=False)
    upgrade(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    env |= {"LORAPLEX_DATABASE_URL": url, "LORAPLEX_ADMIN_KEY": ADMIN,
            "LORAPLEX_DATA_DIR": str(tmp_path / role)}  # fmt: skip
    api_url, proc = start_api_process(env, tmp_path / f"{role}.log")
    return role, api_url, proc, password_file


@pytest.mark.timeout(300)
def test_no_request_fails_past_one_retry_while_the_password_rotates(
    pg_url: str, tmp_path: Path
) -> None:
    role, url, proc, password_file = _api(pg_url, tmp_path, with_file=True)
    try:
        with Load(url) as load:
            time.sleep(0.5)
            _rotate(pg_url, role, password_file)
        assert load.ok > 20, (load.ok, load.failed)
        assert load.failed_twice == 0, (load.ok, load.failed, load.failed_twice)
    finally:
        proc.stop()
    # Control: the password in the URL (today's layout) keeps failing after the rotation.
    role, url, proc, _ = _api(pg_url, tmp_path, with_file=False)
    try:
        with Load(url) as load:
            time.sleep(0.5)
            _rotate(pg_url, role, None)
        assert load.failed_twice > 5, (load.ok, load.failed, load.failed_twice)
    finally:
        proc.stop()

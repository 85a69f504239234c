"""A running stack for the gateway end-to-end tests: the API app under uvicorn and engine
replicas (`python -m loraplex.platform.engine.server`) as real subprocesses on free ports,
each replica kept registered for its deployment by a health-gated heartbeat."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loraplex.platform.gateway.replica_agent import register_replica
from loraplex.platform.wire import WIRE_VERSION, WIRE_VERSION_HEADER, ReplicaState
from loraplex.platform.wire.auth import bearer

WIRE_HEADERS = {
    WIRE_VERSION_HEADER: str(WIRE_VERSION),
    "authorization": bearer(os.environ["LORAPLEX_REPLICA_SECRET"]),  # tests/conftest.py
}


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings_env(settings: Any, **overrides: Any) -> dict[str, str]:
    """The process environment that rebuilds `settings` (LORAPLEX_* variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    values = settings.model_dump()
    values.update(overrides)
    for name, value in values.items():
        if value is not None:
            env[f"LORAPLEX_{name.upper()}"] = str(value)
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{url} exited early ({proc.returncode}):\n{log.read_text()[-4000:]}"
            )
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up:\n{log.read_text()[-4000:]}")


class Proc:
    """One subprocess in its own process group, stopped (and reaped) by `stop()`."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._fh = log.open("wb")
        self.popen = subprocess.Popen(
            args, env=env, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill(self) -> None:
        """SIGKILL at once (a crash)."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._fh.close()


class Replica:
    """An engine replica subprocess plus its registration heartbeat."""

    def __init__(
        self,
        model_dir: Path,
        deployment: str,
        redis_url: str,
        workdir: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            sys.executable,
            "-m",
            "loraplex.platform.engine.server",
            "--model",
            str(model_dir),
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *(extra_args or []),
        ]
        log = workdir / f"replica-{self.port}.log"
        self.proc = Proc(args, env or dict(os.environ), log)
        _wait_http(f"{self.url}/health", self.proc.popen, log)
        # A loaded CI machine can starve the health-gated beat for seconds: a short TTL would
        # expire a live replica mid-test (a dead one is skipped by the router anyway).
        self.heartbeat = register_replica(redis_url, deployment, self.url, ttl_s=15.0)

    def state(self) -> dict[str, Any]:
        """The replica's /state (checked against the wire format)."""
        resp = httpx.get(f"{self.url}/state", headers=WIRE_HEADERS, timeout=5)
        return ReplicaState.model_validate_json(resp.content).model_dump()

    def stop(self) -> None:
        """Deregister and stop."""
        self.heartbeat.stop()
        self.proc.stop()


class Api:
    """The API app (`loraplex.api.app:create_app`) under uvicorn."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "loraplex.api.app:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        log = workdir / f"api-{self.port}.log"
        self.proc = Proc(args, env, log)
        _wait_http(f"{self.url}/healthz", self.proc.popen, log)

    def stop(self) -> None:
        """Stop the server."""
        self.proc.stop()


def fresh_database(pg_url: str, prefix: str = "gwe2e") -> str:
    """Create an empty database next to `pg_url`'s, migrate it to head, return its URL."""
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    from loraplex.platform.db.migrate import upgrade

    url = make_url(pg_url)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    new_url = url.set(database=name).render_as_string(hide_password=False)
    upgrade(new_url)
    return new_url

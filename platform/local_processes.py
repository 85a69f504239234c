"""The platform's own processes started on this machine: an engine replica from an EngineConfig,
the API, a worker. Used by `loraplex up`, the serve benchmark and the end-to-end tests; each
process logs to a file and is stopped through its `ServiceProcess`.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess, free_port, http_ok, listen_socket
from loraplex.platform.engine_spec import EngineConfig, ServerOptions, engine_args


def engine_argv(config: EngineConfig, server: ServerOptions) -> list[str]:
    """The local `loraplex engine` command line running `config` behind `server`."""
    return [sys.executable, "-m", "loraplex.platform.cli", "engine", *engine_args(config, server)]


def start_engine_process(
    config: EngineConfig,
    log: Path,
    env: dict[str, str],
    *,
    host: str = "127.0.0.1",
    log_level: str = "info",
    timeout: float | None = 300,
    sock: socket.socket | None = None,
) -> tuple[str, ServiceProcess]:
    """Start `loraplex engine` for `config` on a listening socket bound here and wait for
    /health: `sock` when given (the caller keeps it, e.g. to restart on the same URL), else a
    fresh one on `host` (the OS picks the port; no bind-then-close race).

    `env` carries the storage settings (`LORAPLEX_S3_*`). Returns the replica URL and its
    process (stopped if it does not come up); `timeout=None` returns at once, without waiting
    (a launcher announces it as starting and lets the gateway wait for it)."""
    own = sock is None
    sock = listen_socket(host, 0) if sock is None else sock
    bound_host, port = sock.getsockname()[:2]
    url = f"http://{bound_host}:{port}"
    proc = ServiceProcess("engine", log)
    options = ServerOptions(bound_host, port, log_level, fd=sock.fileno())
    try:
        proc.start(engine_argv(config, options), env=env, cwd=log.parent, pass_fds=(sock.fileno(),))
    finally:
        if own:
            sock.close()  # the child holds its own copy
    if timeout is not None:
        proc.wait_ready(lambda: http_ok(url + "/health"), timeout)
    return url, proc


def start_api_process(
    env: dict[str, str], log: Path, *, log_level: str = "warning", timeout: float = 120
) -> tuple[str, ServiceProcess]:
    """Start the API (`loraplex api`: the app under uvicorn, draining on SIGTERM) on a free
    loopback port and wait for /healthz; its settings come from `env`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "loraplex.platform.cli", "api",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", log_level]  # fmt: skip
    proc = ServiceProcess("api", log)
    proc.start(argv, env=env, cwd=log.parent)
    proc.wait_ready(lambda: http_ok(url + "/healthz"), timeout)
    return url, proc


def start_worker_process(env: dict[str, str], log: Path) -> ServiceProcess:
    """Start a Celery worker (`loraplex.platform.jobs.worker`) with the settings in `env`."""
    proc = ServiceProcess("worker", log)
    proc.start([sys.executable, "-m", "loraplex.platform.jobs.worker"], env=env, cwd=log.parent)
    return proc

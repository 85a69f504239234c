"""`loraplex up`: the whole platform on one machine, on loopback, under one data dir.

Starts embedded PostgreSQL, SeaweedFS S3 and Redis (each unless its URL is set), migrates
the database, creates the bucket, keeps an admin key, registers the demo model (or
`--model`), then runs a Celery worker, the API and the deployment's engine replicas (through
the local launcher, kept at the row's `replicas` by a reconcile loop) as child processes.
Ctrl-C (or SIGTERM) stops everything it started, in order, each with SIGTERM: the API first
(it stops taking requests and finishes its streams), then the replicas (they drain), the
worker, and the services. A second `up` on the same data dir finds its data again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO

from rich.console import Console

from loraplex.platform.child_env import child_env
from loraplex.platform.embedded.process import (
    EmbeddedServiceError,
    ServiceProcess,
    http_ok,
    listen_socket,
    stop_together,
)
from loraplex.platform.engine_spec import UnservableDeploymentError
from loraplex.platform.replica_secret import ensure_replica_secret
from loraplex.platform.secret_files import read_or_create_secret, token
from loraplex.platform.settings import Settings
from loraplex.platform.supervisor import Supervised, Supervisor

DEMO_MODEL_NAME = "demo"


class UpError(RuntimeError):
    """`up` cannot go on; the message says why and what to do."""


class Stack:
    """What `up` started, each with its stop function; closed in reverse order."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._stops: list[tuple[str, Callable[[], None]]] = []

    def push(self, name: str, stop: Callable[[], None]) -> None:
        """Remember how to stop `name`."""
        self._stops.append((name, stop))

    def close(self) -> None:
        """Stop everything, newest first; one failure does not keep the rest running.

        Ctrl-C / SIGTERM are ignored meanwhile, so a second Ctrl-C cannot leave a service
        half-stopped (children die with this process anyway if it is killed outright)."""
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._close_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _close_all(self) -> None:
        while self._stops:
            name, stop = self._stops.pop()
            began = time.monotonic()
            with self.console.status(f"Stopping {name}…"):
                try:
                    stop()
                except Exception as exc:  # keep stopping the others
                    self.console.print(f"[red]✗[/] stopping {name}: {exc}")
                    continue
            self.console.print(f"[dim]stopped {name} ({time.monotonic() - began:.1f}s)[/]")


def redact(url: str) -> str:
    """`url` with any password replaced by ***."""
    return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the data dir so two `up`s never share one."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle: IO[str] = open(data_dir / "up.lock", "w")  # noqa: SIM115 - held for the whole run
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise UpError(f"another `loraplex up` is running on {data_dir}") from exc
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()


def admin_key(settings: Settings, data_dir: Path) -> str:
    """LORAPLEX_ADMIN_KEY when set, else the key kept in the data dir (made on first run)."""
    if settings.admin_key:
        return settings.admin_key
    return read_or_create_secret(data_dir / "admin_key", lambda: token("lpx-admin-") + "\n")


def ensure_bucket(settings: Settings) -> None:
    """Create the configured bucket if it is missing."""
    from loraplex.platform.services.objects import s3_client

    client = s3_client(settings)
    names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if settings.s3_bucket not in names:
        client.create_bucket(Bucket=settings.s3_bucket)


def model_folder(data_dir: Path, model: Path | None) -> Path:
    """`--model` as given, else the demo model kept in the data dir (written once)."""
    if model is not None:
        folder = model.expanduser().resolve()
        if not (folder / "config.json").is_file():
            raise UpError(f"--model {model}: no config.json there (need a HuggingFace folder)")
        return folder
    folder = data_dir / "models" / DEMO_MODEL_NAME
    if not (folder / "config.json").is_file():
        from loraplex.platform.demo_model import make_demo_model

        make_demo_model(folder)
    return folder


def default_model_name(folder: Path) -> str:
    """A base-model name from a folder name: lower case, [a-z0-9._-] only."""
    name = re.sub(r"[^a-z0-9._-]+", "-", folder.name.lower()).strip("-.") or "model"
    return name[:64]


def _start_child(
    name: str, argv: list[str], log: Path, env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> ServiceProcess:
    proc = ServiceProcess(name, log)
    proc.start(argv, env=env, cwd=log.parent, pass_fds=pass_fds)
    return proc


def _restart_and_wait(proc: ServiceProcess, probe: Callable[[], bool], timeout: float) -> None:
    proc.start_again()
    proc.wait_ready(probe, timeout=timeout)


def _raise_on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def step(console: Console, label: str) -> Iterator[list[str]]:
    """Show a spinner while the block runs, then a check mark with what it appended."""
    notes: list[str] = []
    began = time.monotonic()
    with console.status(f"{label}…"):
        yield notes
    took = time.monotonic() - began
    console.print(f"[green]✓[/] {label}  [dim]{' '.join(notes)} ({took:.1f}s)[/]")


def start_services(
    settings: Settings, stack: Stack, data_dir: Path, watch: list[Supervised] | None = None
) -> dict[str, object]:
    """Start each embedded service whose URL is not set; returns the URLs to fill in. Each
    one started is added to `watch` (restarted by the supervisor if it dies)."""
    watch = [] if watch is None else watch
    from loraplex.platform.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedSeaweedFS

    console = stack.console
    urls: dict[str, object] = {}
    if settings.database_url is None:
        pg = EmbeddedPostgres(data_dir / "postgres")
        stack.push("PostgreSQL", pg.stop)
        with step(console, "PostgreSQL") as note:
            urls["database_url"] = pg.start()
            note.append(redact(pg.url))
        watch.append(Supervised("PostgreSQL", pg.process, pg.start))
    if settings.s3_endpoint_url is None:
        # Random credentials kept in its data dir (not the well-known defaults).
        s3 = EmbeddedSeaweedFS(data_dir / "seaweedfs", region=settings.s3_region)
        stack.push("SeaweedFS S3", s3.stop)
        with step(console, "SeaweedFS S3") as note:
            urls["s3_endpoint_url"] = s3.start()
            urls |= {"s3_access_key": s3.access_key, "s3_secret_key": s3.secret_key}
            note.append(s3.endpoint_url)
        watch.append(Supervised("SeaweedFS S3", s3.process, s3.start))
    if settings.broker_url is None:
        rd = EmbeddedRedis(data_dir / "redis")
        stack.push("Redis", rd.stop)
        with step(console, "Redis") as note:
            urls["broker_url"] = rd.start()
            note.append(redact(rd.url))
        watch.append(Supervised("Redis", rd.process, rd.start))
    return urls


def start_all(
    settings: Settings,
    stack: Stack,
    model: Path | None,
    model_name: str | None,
    engine: bool = True,
    supervisor: Supervisor | None = None,
) -> tuple[Settings, str, list[Supervised]]:
    """Bring every part up in order; returns the final settings, the API URL and what the
    supervisor watches."""
    console = stack.console
    data_dir = settings.data_dir.expanduser().resolve()
    try:  # the API's socket is ours from here on (port 0: the OS picks one)
        api_sock = listen_socket(settings.host, settings.port)
    except OSError as exc:
        raise UpError(f"port {settings.port} on {settings.host} is in use; pass --port") from exc
    stack.push("API socket", api_sock.close)
    folder = model_folder(data_dir, model)  # checked (or written) before anything starts
    name = model_name or (DEMO_MODEL_NAME if model is None else default_model_name(folder))
    watch: list[Supervised] = []
    updates = start_services(settings, stack, data_dir, watch)
    updates["port"] = api_sock.getsockname()[1]
    updates |= {"data_dir": data_dir, "admin_key": admin_key(settings, data_dir)}
    updates["replica_secret"] = ensure_replica_secret(settings, data_dir)
    settings = settings.model_copy(update=updates)
    if settings.database_url is None:  # only if a start above silently gave nothing
        raise UpError("no database URL")

    from loraplex.platform.db.migrate import upgrade
    from loraplex.platform.services.base_models import register_base_model

    with step(console, "Database migrations") as note:
        upgrade(settings.database_url)
        note.append("at head")
    with step(console, "Bucket") as note:
        ensure_bucket(settings)
        note.append(settings.s3_bucket)
    with step(console, "Base model") as note:
        info = register_base_model(settings, name, folder)
        note.append(f"{info.name} ({info.family}) from {folder}")

    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    cli = [sys.executable, "-m", "loraplex.platform.cli"]
    url = f"http://{settings.host}:{settings.port}"
    fd = api_sock.fileno()
    drain = settings.drain_timeout_s + 10
    with step(console, "Worker and API") as note:
        worker = _start_child(
            "worker", [*cli, "worker"], logs / "worker.log", child_env(settings, "worker")
        )
        api = _start_child("API", [*cli, "api", "--fd", str(fd)], logs / "api.log",
                           child_env(settings, "api"), pass_fds=(fd,))  # fmt: skip
        # Both are clients of the services: stopped before them (SIGTERM = graceful for each).
        stack.push("worker and API", lambda: stop_together([api, worker], signal.SIGTERM, drain))
        api_ok = lambda: http_ok(url + "/healthz")  # noqa: E731
        api.wait_ready(api_ok, timeout=90)
        if not worker.running():
            raise worker.fail("exited")
        note.append(url)
    watch.append(Supervised("worker", worker, worker.start_again))
    watch.append(Supervised("API", api, lambda: _restart_and_wait(api, api_ok, 90)))
    if engine:
        env = child_env(settings, "engine")
        supervisor = supervisor or Supervisor(lambda text: None)
        start_serving(settings, stack, folder, name, logs, env, supervisor)
        # Closed before the replicas: the API finishes its streams while they still serve.
        stack.push("API (draining)", lambda: api.stop(signal.SIGTERM, timeout=drain))
    return settings, url, watch


def start_serving(
    settings: Settings,
    stack: Stack,
    folder: Path,
    name: str,
    logs: Path,
    env: dict[str, str],
    supervisor: Supervisor,
) -> None:
    """The base model's deployment, its replicas (the local launcher, each one handed to the
    supervisor) and the reconcile loop that keeps them at the row's `replicas`."""
    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.launcher.local import LocalLauncher
    from loraplex.platform.launcher.reconcile import Reconciler
    from loraplex.platform.up_replica import ensure_deployment

    with step(stack.console, "Deployment") as note:
        deployment = ensure_deployment(settings, name, folder)
        note.append(f"{deployment.name} (max_loras {deployment.config.max_loras}, "
                    f"max_lora_rank {deployment.config.max_lora_rank}, "
                    f"replicas {deployment.row.replicas})")  # fmt: skip
    # `up`'s base model from its local folder; any other an operator registers, from S3.
    launcher = LocalLauncher(settings, logs, env, local_models={name: folder},
                             watch=supervisor.add, unwatch=supervisor.remove)  # fmt: skip
    stack.push("engine replicas", launcher.stop_all)
    with step(stack.console, "Engine replicas") as note:
        launcher.scale(deployment.row, deployment.row.replicas)
        launcher.wait_ready(deployment.name)
        urls = [r.url for r in launcher.replicas(deployment.name)]
        note.append(f"{', '.join(urls) or 'none (replicas 0)'}, serving {name!r}")
    assert settings.database_url is not None
    # Every deployment: one an operator creates or scales gets its replicas started here too.
    reconciler = Reconciler(launcher, make_sessionmaker(settings.database_url))
    reconciler.seen[deployment.name] = deployment.row.replicas
    stack.push("reconcile loop", reconciler.start().close)


def run_up(
    settings: Settings,
    *,
    model: Path | None = None,
    model_name: str | None = None,
    engine: bool = True,
) -> int:
    """Run `loraplex up` until Ctrl-C / SIGTERM; returns the exit code."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper when it is a TTY or pipe
    console = Console(highlight=False)
    signal.signal(signal.SIGTERM, _raise_on_term)
    data_dir = settings.data_dir.expanduser().resolve()
    stack = Stack(console)
    code = 0
    try:
        with data_dir_lock(data_dir):
            try:
                console.print(f"loraplex up — data in {data_dir}")
                supervisor = Supervisor(
                    lambda text: console.print(
                        f"[yellow]![/] {text}", markup=True, highlight=False
                    ),
                    state_file=data_dir / "logs" / "supervisor.json",
                )
                settings, url, children = start_all(
                    settings, stack, model, model_name, engine, supervisor
                )
                console.print()
                for line in ready_lines(settings, url, data_dir):
                    console.print(line, markup=False, soft_wrap=True)
                code = supervise(supervisor, children, stack)
            except KeyboardInterrupt:
                console.print("\nShutting down…")
            except (UpError, EmbeddedServiceError, UnservableDeploymentError) as exc:
                console.print(f"[red]error:[/] {exc}")
                code = 1
            except Exception as exc:
                report = data_dir / "logs" / "up-error.log"
                report.parent.mkdir(parents=True, exist_ok=True)
                report.write_text(traceback.format_exc())
                message = getattr(exc, "message", None) or str(exc)
                console.print(f"[red]error:[/] {type(exc).__name__}: {message}", markup=False)
                console.print(f"[dim](traceback in {report})[/]")
                code = 1
            finally:
                stack.close()
    except UpError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    return code


def _no_operator_yet(settings: Settings) -> bool:
    """True while the console has no operator (the admin key then creates the first owner)."""
    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.services.operators import count_operators

    assert settings.database_url is not None
    with session_scope(make_sessionmaker(settings.database_url)) as session:
        return count_operators(session) == 0


def _cli_folder() -> Path:
    """The folder holding the `loraplex` command of this interpreter (the venv's bin)."""
    here = Path(sys.executable).parent
    found = shutil.which("loraplex")
    return here if (here / "loraplex").exists() or found is None else Path(found).parent


def ready_lines(settings: Settings, url: str, data_dir: Path) -> list[str]:
    """What `up` prints once ready: where things are, and `export` lines that, pasted into
    another shell, put `loraplex` on its PATH and point the CLI at this stack."""
    hint = "  (first sign-in: the admin key)" if _no_operator_yet(settings) else ""
    key = settings.admin_key or ""
    return [
        f"URL: {url}",
        f"Console: {url}/console/{hint}",
        f"Admin key: {key}",
        f"Logs: {data_dir / 'logs'}",
        "",
        "In another shell, paste these lines to use the CLI against this stack:",
        f'  export PATH={shlex.quote(str(_cli_folder()))}:"$PATH"',
        f"  export LORAPLEX_URL={shlex.quote(url)}",
        f"  export LORAPLEX_ADMIN_KEY={shlex.quote(key)}",
        "",
        "Press Ctrl-C to stop.",
    ]


def supervise(supervisor: Supervisor, children: list[Supervised], stack: Stack) -> int:
    """Keep the children running until Ctrl-C / SIGTERM (raised as KeyboardInterrupt)."""
    for child in children:
        supervisor.add(child)
    stack.push("supervisor", supervisor.close)  # stopped first: no restart during shutdown
    supervisor.run()
    return 0

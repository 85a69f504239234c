"""`loraplex`: the command line. Subcommands import what they need only when run,
so `loraplex --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loraplex.platform.settings import Settings


def _settings(**overrides: Any) -> Settings:
    from loraplex.platform.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def cmd_up(args: argparse.Namespace) -> int:
    """Start everything on loopback; see `loraplex.platform.up`."""
    from loraplex.platform.up import run_up

    settings = _settings(data_dir=args.data_dir, port=args.port, host=args.host)
    return run_up(settings, model=args.model, model_name=args.model_name, engine=not args.no_engine)


def cmd_api(args: argparse.Namespace) -> int:
    """Serve the REST API (FastAPI app factory) with uvicorn; SIGTERM drains it (exit 0)."""
    from loraplex.platform.graceful import serve

    settings = _settings(port=args.port, host=args.host)
    where = (
        {"fd": args.fd} if args.fd is not None else {"host": settings.host, "port": settings.port}
    )
    return serve("loraplex.api.app:create_app", factory=True, log_level=args.log_level,
                 drain_timeout_s=settings.drain_timeout_s, **where)  # fmt: skip


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the Celery worker (validation, deletion, roll-ups)."""
    import logging

    from loraplex.platform.jobs.worker import run_worker

    logging.basicConfig(level=args.log_level.upper())
    run_worker(_settings())
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    """Run an engine replica; its own parser reads the remaining arguments."""
    from loraplex.platform.engine.server import main as engine_main

    return int(engine_main(list(args.rest)) or 0)


def cmd_models_add(args: argparse.Namespace) -> int:
    """Upload a HuggingFace folder to object storage and register it as a base model."""
    from loraplex.platform.services.base_models import register_base_model
    from loraplex.platform.services.errors import ServiceError

    try:
        info = register_base_model(_settings(), args.name, args.path)
    except ServiceError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(
        f"registered base model {info.name!r} ({info.family}) at {info.object_prefix} "
        f"({info.uploaded_files} files uploaded)"
    )
    return 0


def cmd_models_demo(args: argparse.Namespace) -> int:
    """Write the small random-weight Llama demo model to a folder."""
    from loraplex.platform.demo_model import make_demo_model

    out = make_demo_model(args.out, seed=args.seed)
    print(out)
    return 0


def cmd_admin_create_user(args: argparse.Namespace) -> int:
    """Create a console operator (the password from --password-stdin or a prompt)."""
    import getpass

    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.services.errors import ServiceError
    from loraplex.platform.services.operators import create_operator

    settings = _settings()
    if not settings.database_url:
        print("error: LORAPLEX_DATABASE_URL is not set", file=sys.stderr)
        return 2
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("error: the passwords differ", file=sys.stderr)
            return 2
    try:
        with session_scope(make_sessionmaker(settings.database_url)) as session:
            op = create_operator(session, args.email, password, args.role, actor="cli")
            print(f"created {op.role} {op.email}")
    except ServiceError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    return 0


# The benchmarks are their own part (`bench/`), reached by import string like the gateway's app:
# no runtime module imports them (import contract `bench-outside-runtime`), and the container
# images, which install the runtime parts only, do not carry them.
BENCH_PACKAGE = "loraplex.bench"
BENCH_MISSING = (
    "error: the benchmarks are not installed here (the bench/ part installs from a source "
    "checkout; the container images leave it out)"
)


def available_benches() -> list[str]:
    """Names of the modules under `loraplex.bench` ([] where that part is not installed)."""
    try:
        bench = importlib.import_module(BENCH_PACKAGE)
    except ModuleNotFoundError as exc:
        if exc.name != BENCH_PACKAGE:
            raise  # the part is there but something it imports is not: show that
        return []
    return sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")
    )


def cmd_bench(args: argparse.Namespace) -> int:
    """Run `loraplex.bench.<name>:main(argv)`."""
    names = available_benches()
    if not names:
        print(BENCH_MISSING, file=sys.stderr)
        return 2
    if not args.name or args.name in ("-h", "--help"):
        print("usage: loraplex bench NAME [ARGS...]")
        print(f"available: {', '.join(names) or '(none)'}")
        return 0 if args.name else 2
    args.name = args.name.replace("-", "_")  # `bench gpu-check` runs module gpu_check
    if args.name not in names:
        print(
            f"error: unknown benchmark {args.name!r}; available: {', '.join(names) or '(none)'}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"{BENCH_PACKAGE}.{args.name}")
    return int(module.main(list(args.rest)) or 0)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (no heavy imports)."""
    parser = argparse.ArgumentParser(
        prog="loraplex", description="Multi-tenant LoRA and MoE model hosting."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start everything locally: services, worker and API")
    up.add_argument("--data-dir", type=Path, help="where data lives (default: LORAPLEX_DATA_DIR "
                    "or the user data directory)")  # fmt: skip
    up.add_argument("--port", type=int, help="API port (default: LORAPLEX_PORT or 8000)")
    up.add_argument("--host", help="API bind address (default 127.0.0.1)")
    up.add_argument("--model", type=Path, help="HuggingFace folder to register instead of the demo")
    up.add_argument("--model-name", help="name for --model (default: the folder's name)")
    up.add_argument("--no-engine", action="store_true", help="control plane only: no replica")
    up.set_defaults(func=cmd_up)

    api = sub.add_parser("api", help="serve the REST API")
    api.add_argument("--host")
    api.add_argument("--port", type=int)
    api.add_argument("--fd", type=int, help="serve on this inherited listening socket")
    api.add_argument("--log-level", default="info")
    api.set_defaults(func=cmd_api)

    worker = sub.add_parser("worker", help="run the background job worker")
    worker.add_argument("--log-level", default="info")
    worker.set_defaults(func=cmd_worker)

    engine = sub.add_parser("engine", help="run an engine replica", add_help=False)
    engine.add_argument("rest", nargs=argparse.REMAINDER)
    engine.set_defaults(func=cmd_engine)

    models = sub.add_parser("models", help="manage base models")
    msub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    add = msub.add_parser("add", help="upload a HuggingFace folder and register it")
    add.add_argument("name")
    add.add_argument("path", type=Path)
    add.set_defaults(func=cmd_models_add)
    demo = msub.add_parser("demo", help="write the small random-weight Llama demo model")
    demo.add_argument("--out", type=Path, default=Path("demo-model"))
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_models_demo)

    from loraplex.platform.launcher.run import add_parser as add_launcher_command

    add_launcher_command(sub)

    from loraplex.platform.opcli.commands import add_parsers as add_operator_commands

    add_operator_commands(sub)

    admin = sub.add_parser("admin", help="console operators")
    asub = admin.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    cu = asub.add_parser("create-user", help="create a console operator account")
    cu.add_argument("email")
    cu.add_argument("--role", choices=["owner", "operator", "viewer"], default="operator")
    cu.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    cu.set_defaults(func=cmd_admin_create_user)

    bench = sub.add_parser("bench", help="run a benchmark", add_help=False)
    bench.add_argument("name", nargs="?", default="")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    return parser


# Commands whose arguments belong to another parser: everything after the name is passed on
# (argparse's REMAINDER cannot start with an option such as `--model`).
PASS_THROUGH = ("engine", "bench")


def _pass_through(argv: list[str]) -> argparse.Namespace | None:
    if not argv or argv[0] not in PASS_THROUGH:
        return None
    command, rest = argv[0], argv[1:]
    if command == "bench":
        name = rest[0] if rest else ""
        return argparse.Namespace(func=cmd_bench, name=name, rest=rest[1:])
    return argparse.Namespace(func=cmd_engine, rest=rest)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `loraplex` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _pass_through(argv) or build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

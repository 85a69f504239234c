"""Run the Alembic migrations programmatically (what `loraplex up` and tests call)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config

from .session import normalize_url

# Found by name, not imported: the migrations import the models, so `db` never imports them.
_SPEC = importlib.util.find_spec("loraplex.migrations")
assert _SPEC is not None and _SPEC.origin is not None
MIGRATIONS_DIR = Path(_SPEC.origin).resolve().parent


def alembic_config(database_url: str) -> Config:
    """An Alembic config for our migrations folder, bound to `database_url`."""
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["database_url"] = normalize_url(database_url)
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database at `database_url` up to `revision` (default: the latest)."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Take the database at `database_url` down to `revision` ("base" empties it)."""
    command.downgrade(alembic_config(database_url), revision)


def current_revision(database_url: str) -> str | None:
    """The revision the database is at, or None before the first migration."""
    from alembic.runtime.migration import MigrationContext

    from .session import get_engine

    with get_engine(database_url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def main(argv: list[str] | None = None) -> int:
    """`python -m loraplex.platform.db.migrate [upgrade|downgrade] [REVISION]`: migrate the
    database in `LORAPLEX_DATABASE_URL` (the Kubernetes migration Job runs `upgrade head`
    before each rollout; a rollback across a migration first runs `downgrade`)."""
    import argparse

    from loraplex.platform.settings import Settings

    p = argparse.ArgumentParser(prog="python -m loraplex.platform.db.migrate")
    p.add_argument("direction", nargs="?", choices=["upgrade", "downgrade"], default="upgrade")
    p.add_argument("revision", nargs="?", default=None, help="default: head (upgrade only)")
    args = p.parse_args(argv)
    url = Settings().database_url
    if not url:
        p.error("LORAPLEX_DATABASE_URL is not set")
    if args.direction == "upgrade":
        upgrade(url, args.revision or "head")
    elif args.revision is None:
        p.error("downgrade needs the revision to go down to")
    else:
        downgrade(url, args.revision)
    print(f"database at {current_revision(url)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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

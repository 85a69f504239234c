"""Alembic environment: binds the migrations to loraplex's metadata and a URL from the caller."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import pool

from loraplex.platform.db.models import Base
from loraplex.platform.db.session import new_engine, normalize_url

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("LORAPLEX_DATABASE_URL")
    if not url:
        raise RuntimeError(
            "no database URL: call loraplex.platform.db.migrate.upgrade(url) "
            "or set LORAPLEX_DATABASE_URL"
        )
    return normalize_url(url)


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it (`alembic upgrade head --sql`)."""
    context.configure(url=_database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations over a fresh connection (or one handed in by the caller)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = new_engine(_database_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

"""The worker's database sessions: its settings always name the database."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.settings import Settings


def job_sessions(settings: Settings) -> sessionmaker[Session]:
    """The session factory over `settings.database_url` (ValueError when it is unset)."""
    if settings.database_url is None:
        raise ValueError("the worker needs LORAPLEX_DATABASE_URL")
    return make_sessionmaker(settings.database_url)

"""The worker's session factory: over the settings' database, and a clear error without one."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.settings import Settings


def test_job_sessions_open_the_settings_database(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'jobs.db'}")
    with job_sessions(settings)() as session:
        assert session.execute(text("select 1")).scalar_one() == 1


def test_job_sessions_refuse_settings_without_a_database() -> None:
    with pytest.raises(ValueError, match="LORAPLEX_DATABASE_URL"):
        job_sessions(Settings(database_url=None))

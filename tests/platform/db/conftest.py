"""Fixtures for the schema tests: an empty database per test on the session's PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.control_plane import create_database, drop_database


@pytest.fixture
def empty_db_url(pg_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A brand-new empty database (dropped after the test)."""
    url = create_database(pg_url, request.node.name)
    try:
        yield url
    finally:
        drop_database(pg_url, url)

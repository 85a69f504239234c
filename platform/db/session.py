"""Engines and session factories built from a database URL (psycopg 3 driver)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

_ENGINES: dict[str, Engine] = {}
_LOCK = threading.Lock()


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for plain `postgresql://` URLs."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


def get_engine(url: str) -> Engine:
    """One pooled engine per URL for the process (engines are expensive; sessions are cheap)."""
    url = normalize_url(url)
    with _LOCK:
        engine = _ENGINES.get(url)
        if engine is None:
            engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
            _ENGINES[url] = engine
        return engine


def dispose_engine(url: str) -> None:
    """Close the pooled connections of one URL (before dropping its database, say)."""
    with _LOCK:
        engine = _ENGINES.pop(normalize_url(url), None)
    if engine is not None:
        engine.dispose()


def make_sessionmaker(url: str) -> sessionmaker[Session]:
    """A session factory over the URL's shared engine; objects stay usable after commit."""
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A transaction: commit on success, roll back on error, always close."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()

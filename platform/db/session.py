"""Engines and session factories built from a database URL (psycopg 3 driver).

A URL may name a password file instead of holding the password:
`postgresql://loraplex@db:5432/loraplex?sslmode=require&password_file=/run/secrets/db/password`.
Every new connection then reads the password from that file (a Kubernetes Secret mounted as a
volume, which the kubelet rewrites when the Secret changes), and a connection refused for its
password rereads the file until it changes (up to `AUTH_WAIT_S`) instead of failing at once:
a password rotated under a running process costs a new connection a short wait, no error.
Connections already open stay open (PostgreSQL checks a password only at connect).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Result, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

PASSWORD_FILE = "password_file"
# How long a connection refused for its password waits for the password file to change.
AUTH_WAIT_S = 30.0
_POLL_S = 0.1

_ENGINES: dict[str, Engine] = {}
_LOCK = threading.Lock()


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for plain `postgresql://` URLs."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


def new_engine(url: str, **options: Any) -> Engine:
    """A new engine for `url` (with its `password_file`, if it names one); `options` go to
    `create_engine`."""
    parsed = make_url(normalize_url(url))
    query = dict(parsed.query)
    password_file = query.pop(PASSWORD_FILE, None)
    engine = create_engine(parsed.set(query=query), **options)
    if password_file:
        path = Path(password_file if isinstance(password_file, str) else password_file[0])
        event.listen(engine, "do_connect", _connect_with_password_file(path))
    return engine


def get_engine(url: str) -> Engine:
    """One pooled engine per URL for the process (engines are expensive; sessions are cheap)."""
    url = normalize_url(url)
    with _LOCK:
        engine = _ENGINES.get(url)
        if engine is None:
            engine = new_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
            _ENGINES[url] = engine
        return engine


def read_password(path: Path) -> str:
    """The password held in `path` (one line; surrounding whitespace dropped)."""
    return path.read_text().strip()


def _auth_refused(exc: BaseException) -> bool:
    """Whether a connect failed on its credentials (SQLSTATE 28P01 / 28000)."""
    state = getattr(exc, "sqlstate", None)
    text = str(exc)
    return state in ("28P01", "28000") or "password authentication failed" in text


def _connect_with_password_file(path: Path) -> Callable[..., Any]:
    """A `do_connect` hook: connect with the file's password; refused, wait for a new one."""

    def connect(dialect: Any, _record: Any, cargs: tuple, cparams: dict[str, Any]) -> Any:
        password = read_password(path)
        deadline = time.monotonic() + AUTH_WAIT_S
        while True:
            try:
                return dialect.connect(*cargs, **{**cparams, "password": password})
            except Exception as exc:
                if not _auth_refused(exc):
                    raise
                tried = password
                while password == tried:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(_POLL_S)
                    password = read_password(path)

    return connect


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


def rowcount(result: Result[Any]) -> int:
    """Rows an executed UPDATE or DELETE matched (its result is a `CursorResult`)."""
    return cast(CursorResult[Any], result).rowcount

"""The one place secret files are written: created 0600 from their first byte, atomically.

A secret is written to a temporary file opened with mode 0600 (`O_EXCL`, so never someone
else's file), synced, then linked or renamed into place: no reader ever sees it half-written
or with wider permissions, and no chmod follows a write. `up` keeps its admin key, database
password, S3 credentials, Redis password (and replica secret) through these functions.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

SECRET_MODE = 0o600


def _temp_with(path: Path, content: str) -> Path:
    """A new 0600 temporary file next to `path` holding `content` (synced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_secret_file(path: Path, content: str, *, owner: tuple[int, int] | None = None) -> None:
    """Write (or replace) a secret file atomically with mode 0600, optionally chown-ed to
    `owner` (uid, gid) before it appears at `path`."""
    path = Path(path)
    tmp = _temp_with(path, content)
    try:
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_or_create_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept at `path`, made by `make()` on first use (kept across restarts).

    Creation is atomic and first-writer-wins: a concurrent creator's value is read back."""
    path = Path(path)
    if not path.exists():
        tmp = _temp_with(path, make())
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # fails if another process created it meanwhile
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text(encoding="utf-8").strip()


def token(prefix: str = "", nbytes: int = 32) -> str:
    """A fresh random secret (URL-safe text)."""
    return prefix + secrets.token_urlsafe(nbytes)

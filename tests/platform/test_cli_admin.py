"""`loraplex admin create-user` as an operator runs it: the account lands hashed (argon2id)
and signs in; bad input exits non-zero with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import select
from support.control_plane import drop_database, fresh_database

from loraplex.platform.db.models import AuditLog, Operator
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services.operators import authenticate

CLI = [sys.executable, "-m", "loraplex.platform.cli", "admin", "create-user"]


def _run(db_url: str, *args: str, password: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    env["LORAPLEX_DATABASE_URL"] = db_url
    return subprocess.run([*CLI, *args, "--password-stdin"], input=password + "\n", env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_create_user_then_authenticate(pg_url: str) -> None:
    db = fresh_database(pg_url, "cliadmin")
    try:
        out = _run(db, "Ops@Example.com", "--role", "owner", password="a long password here")
        assert out.returncode == 0, out.stderr
        assert "created owner ops@example.com" in out.stdout
        with session_scope(make_sessionmaker(db)) as s:
            op = s.scalars(select(Operator)).one()
            assert op.password_hash.startswith("$argon2id$")
            assert "a long password" not in op.password_hash
            assert authenticate(s, "ops@example.com", "a long password here") is not None
            assert authenticate(s, "ops@example.com", "wrong password!!") is None
            assert s.scalars(select(AuditLog.action)).all() == ["operator.create"]
        dup = _run(db, "ops@example.com", password="another long password")
        assert dup.returncode == 1 and "exists already" in dup.stderr
        short = _run(db, "new@example.com", password="short")
        assert short.returncode == 1 and "12" in short.stderr
    finally:
        drop_database(pg_url, db)

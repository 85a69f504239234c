"""`python -m loraplex.platform.db.migrate`: what the Kubernetes migration Job runs."""

from __future__ import annotations

import os
import subprocess
import sys

from loraplex.platform.db.migrate import current_revision


def _run(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LORAPLEX_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "loraplex.platform.db.migrate", *args],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


def test_upgrade_and_downgrade_from_the_environment(empty_db_url: str) -> None:
    up = _run(empty_db_url, "upgrade", "head")
    assert up.returncode == 0, up.stderr
    head = current_revision(empty_db_url)
    assert head is not None and f"database at {head}" in up.stdout
    refused = _run(empty_db_url, "downgrade")
    assert refused.returncode == 2 and "needs the revision" in refused.stderr
    down = _run(empty_db_url, "downgrade", "base")
    assert down.returncode == 0 and "database at None" in down.stdout, down.stderr
    assert current_revision(empty_db_url) is None

"""What `loraplex up` prints once it is ready: the first-sign-in hint only while no operator
exists, and `export` lines that, pasted into a new shell, put `loraplex` on the PATH and point
it at this stack."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from support.console import make_operator
from support.fixtures import cp_settings

from loraplex.platform.up import ready_lines

__all__ = ["cp_settings"]


def _pasted(lines: list[str]) -> list[str]:
    """Run the printed `export` lines in a fresh shell (an empty environment, as a new login
    has no venv), then ask it where `loraplex` is and what the two variables hold."""
    exports = "\n".join(line.strip() for line in lines if line.strip().startswith("export "))
    script = exports + '\ncommand -v loraplex\necho "$LORAPLEX_URL"\necho "$LORAPLEX_ADMIN_KEY"\n'
    done = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", "--norc", "-c", script],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_ready_lines_paste_into_a_new_shell(cp_settings: Any, tmp_path: Path) -> None:
    s = cp_settings.model_copy(update={"admin_key": "lp_admin_$(touch pwned)'quote"})
    lines = ready_lines(s, "http://127.0.0.1:8123", tmp_path)
    where, url, key = _pasted(lines)
    assert Path(where).name == "loraplex" and Path(where).exists()
    assert url == "http://127.0.0.1:8123" and key == s.admin_key
    assert not (tmp_path / "pwned").exists()


def test_first_sign_in_hint_only_while_no_operator_exists(cp_settings: Any, tmp_path: Path) -> None:
    before = "\n".join(ready_lines(cp_settings, "http://x", tmp_path))
    assert "first sign-in: the admin key" in before
    make_operator(cp_settings.database_url, "first@example.com", "owner")
    after = "\n".join(ready_lines(cp_settings, "http://x", tmp_path))
    assert "first sign-in" not in after and "/console/" in after

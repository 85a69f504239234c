"""Running `loraplex` operator commands as a user does (a subprocess with LORAPLEX_URL and
the keys in its environment) against a running API."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

CLI = [sys.executable, "-m", "loraplex.platform.cli"]


@dataclass
class OperatorShell:
    """The environment an operator's shell has: the API URL, the admin key, maybe a tenant key."""

    url: str
    admin_key: str
    api_key: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """The child environment (no other LORAPLEX_ variables leak in from the test run)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
        env |= {"LORAPLEX_URL": self.url, "LORAPLEX_ADMIN_KEY": self.admin_key, **self.extra}
        if self.api_key is not None:
            env["LORAPLEX_API_KEY"] = self.api_key
        return env

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`loraplex ARGS...`; the finished process (stdout and stderr captured as text)."""
        return subprocess.run(
            [*CLI, *args], env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def ok(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`run`, asserting exit status 0."""
        out = self.run(*args, timeout=timeout)
        assert out.returncode == 0, f"loraplex {' '.join(args)}: {out.stdout}\n{out.stderr}"
        return out

    def fails(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`run`, asserting a non-zero exit and an `error: ...` line on stderr."""
        out = self.run(*args, timeout=timeout)
        assert out.returncode != 0, f"loraplex {' '.join(args)} succeeded: {out.stdout}"
        assert "error: " in out.stderr, out.stderr
        return out

"""Running `loraplex` operator commands as a user does (a subprocess with LORAPLEX_URL and
the keys in its environment) against a running API, and `loraplex up` itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from support.up_process import ctrl_c_reaches_it

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


@contextmanager
def running_up(
    data_dir: Path, timeout_s: float = 240, printed_lines: list[str] | None = None
) -> Iterator[tuple[str, str]]:
    """`loraplex up --port 0` as a user starts it (engine included); yields (URL, admin key)
    from what it prints (every line also lands in `printed_lines` when given), and stops it
    with Ctrl-C (SIGINT) on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    proc = subprocess.Popen(
        [*CLI, "up", "--data-dir", str(data_dir), "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    lines: list[str] = printed_lines if printed_lines is not None else []
    reader = threading.Thread(
        target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout or []), daemon=True
    )
    reader.start()

    def printed(label: str) -> str | None:
        found = [ln.split(": ", 1)[1].strip() for ln in list(lines) if ln.startswith(label + ": ")]
        return found[0] if found else None

    try:
        deadline = time.monotonic() + timeout_s
        while not (printed("URL") and printed("Admin key")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("loraplex up did not start:\n" + "\n".join(lines))
            time.sleep(0.2)
        yield str(printed("URL")), str(printed("Admin key"))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        reader.join(timeout=5)

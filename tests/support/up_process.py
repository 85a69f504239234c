"""`loraplex up` as a subprocess for tests: start it on a data dir, read what it printed, find
its supervised children (`logs/supervisor.json`) and wait for one to be restarted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

START_TIMEOUT_S = 180


def ctrl_c_reaches_it() -> None:
    """A `preexec_fn`: SIGINT back to its default in the child. A shell starts a background job
    with SIGINT ignored and every child inherits that, so a suite run as one would see each
    `up` it stops with Ctrl-C ignore it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class UpProcess:
    """A running `loraplex up` and the lines it printed so far."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        env_extra: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
        env |= env_extra or {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loraplex.platform.cli", "up"]
            + ["--data-dir", str(data_dir), "--port", str(port), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=ctrl_c_reaches_it,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def value(self, label: str) -> str | None:
        for line in self.lines:
            if line.startswith(label + ": "):
                return line.split(": ", 1)[1].strip()
        return None

    def wait_started(self) -> tuple[str, str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            url, key = self.value("URL"), self.value("Admin key")
            if url and key:
                return url, key
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.proc.kill()
        pytest.fail("loraplex up did not start:\n" + "\n".join(self.lines))

    def descendants(self) -> set[int]:
        """Every process below `up` right now (from /proc)."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
        found: set[int] = set()
        todo = [self.proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found

    def interrupt(self, timeout: float = 90) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("loraplex up ignored Ctrl-C:\n" + "\n".join(self.lines))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def supervised(data_dir: Path) -> dict:
    """The supervisor's record of its children (name -> pid, state, restarts)."""
    return json.loads((data_dir / "logs" / "supervisor.json").read_text())


def restarted(data_dir: Path, name: str, old_pid: int, timeout: float = 120) -> int:
    """Wait until the supervisor runs `name` again under a new pid; that pid."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            child = supervised(data_dir)[name]
            if child["pid"] != old_pid and child["state"] == "running" and alive(child["pid"]):
                return child["pid"]
        time.sleep(0.2)
    pytest.fail(f"{name} was not restarted: {supervised(data_dir)}")

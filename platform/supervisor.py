"""Process supervision for `loraplex up`: a crashed child is restarted with backoff, one that
keeps crashing is reported with its log tail and given up on; the others keep running.

Each supervised child is a `ServiceProcess` plus a `restart()` that starts it again and waits
until it is ready (an embedded service's `start()`, or a child command's start-and-wait).
The supervisor polls every child; when one has died it kills what is left of its process
group (a PostgreSQL killed -9 leaves its backends holding shared memory), waits
`backoff_s(tries)`, restarts it on a thread of its own (a slow engine start never delays
noticing another crash), and counts the try. That thread lives as long as this process: the
children die with the thread that spawned them (Linux parent-death signal), so it must not
end while they run. A child that stayed up `stable_after_s` is
considered healthy again (its count resets); past `max_restarts` tries in a row it is given
up on. Its state (running, restarting, given up; pid; restarts) is written to a JSON file
after every change, for operators and for the chaos tests built on this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess, log_tail

RUNNING, RESTARTING, GAVE_UP, STOPPED = "running", "restarting", "gave_up", "stopped"


@dataclass
class ChildState:
    """What the supervisor knows of one child (the JSON state file holds these)."""

    name: str
    state: str = RUNNING
    pid: int | None = None
    restarts: int = 0
    failures_in_a_row: int = 0
    last_exit_code: int | None = None
    last_error: str | None = None
    up_since: float = field(default_factory=time.time)


@dataclass
class Supervised:
    """A child to watch: its process and how to bring it back."""

    name: str
    process: ServiceProcess
    restart: Callable[[], object]  # what it returns (a URL, say) is not used


# A restart a child's thread runs: the child, its state, the delay before it.
_Restart = tuple[Supervised, ChildState, float]


class Supervisor:
    """Watches children and restarts the ones that die (see the module docstring)."""

    def __init__(
        self,
        report: Callable[[str], None],
        *,
        max_restarts: int = 5,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_after_s: float = 60.0,
        poll_s: float = 0.5,
        state_file: Path | None = None,
    ) -> None:
        self.report = report
        self.max_restarts = max_restarts
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.poll_s = poll_s
        self.state_file = state_file
        self.children: dict[str, Supervised] = {}
        self.states: dict[str, ChildState] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._restarters: dict[str, queue.SimpleQueue[_Restart]] = {}

    def add(self, child: Supervised) -> None:
        """Watch `child` (already started)."""
        with self._lock:
            self.children[child.name] = child
            self.states[child.name] = ChildState(child.name, pid=child.process.pid)
        self._save()

    def remove(self, name: str) -> None:
        """Stop watching `name` (a launcher scaling it away stops it); a restart of it that is
        under way is abandoned."""
        with self._lock:
            self.children.pop(name, None)
            self.states.pop(name, None)
        self._save()

    def _watching(self, child: Supervised) -> bool:
        return self.children.get(child.name) is child

    def backoff_s(self, failures: int) -> float:
        """Seconds to wait before try number `failures` (1, 2, 4, ... up to the cap)."""
        return min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, failures - 1))

    def poll(self) -> None:
        """One pass: notice dead children and start their restarts."""
        for name, child in list(self.children.items()):
            st = self.states.get(name)
            if st is None:  # removed meanwhile
                continue
            if st.state != RUNNING or self._stopping.is_set():
                continue
            if child.process.running():
                if st.failures_in_a_row and time.time() - st.up_since >= self.stable_after_s:
                    st.failures_in_a_row = 0
                continue
            self._crashed(child, st)

    def _crashed(self, child: Supervised, st: ChildState) -> None:
        proc = child.process.proc
        st.last_exit_code = None if proc is None else proc.returncode
        _kill_group(child.process)
        st.failures_in_a_row += 1
        if st.failures_in_a_row > self.max_restarts:
            # reported before the state changes: whoever sees GAVE_UP has the report too
            self.report(
                f"{child.name} keeps crashing (exit code {st.last_exit_code}; "
                f"{self.max_restarts} restarts in a row failed): giving up on it. Last lines "
                f"of {child.process.log_path}:\n{log_tail(child.process.log_path)}"
            )
            st.state = GAVE_UP
            self._save()
            return
        delay = self.backoff_s(st.failures_in_a_row)
        st.state = RESTARTING
        self.report(
            f"{child.name} exited (code {st.last_exit_code}); restarting in {delay:.0f}s "
            f"(try {st.failures_in_a_row} of {self.max_restarts})"
        )
        self._save()
        if child.name not in self._restarters:
            self._restarters[child.name] = queue.SimpleQueue()
            threading.Thread(
                target=self._restarter,
                args=(self._restarters[child.name],),
                name=f"restart-{child.name}",
                daemon=True,
            ).start()
        self._restarters[child.name].put((child, st, delay))

    def _restarter(self, todo: queue.SimpleQueue[_Restart]) -> None:
        while True:  # never returns: see the module docstring
            self._restart(*todo.get())

    def _restart(self, child: Supervised, st: ChildState, delay: float) -> None:
        if self._stopping.wait(delay) or not self._watching(child):
            return
        began = time.monotonic()
        try:
            child.restart()
        except Exception as exc:  # noqa: BLE001 - a failed start counts as a crash
            st.last_error = str(exc)[-2000:]
        if self._stopping.is_set() or not self._watching(child):
            child.process.stop(timeout=10)  # shut down or removed while it started
            return
        st.pid = child.process.pid
        st.restarts += 1
        st.up_since = time.time()
        st.state = RUNNING
        if child.process.running():
            st.last_error = None
            self.report(f"{child.name} restarted ({time.monotonic() - began:.1f}s)")
        self._save()  # a start that failed is seen dead by the next poll and tried again

    def run(self, until: threading.Event | None = None) -> None:
        """Poll until `until` is set (or forever); Ctrl-C reaches the caller."""
        while not (until is not None and until.is_set()):
            self.poll()
            time.sleep(self.poll_s)

    def close(self) -> None:
        """Stop restarting (the caller then stops the children)."""
        self._stopping.set()
        for st in self.states.values():
            if st.state in (RUNNING, RESTARTING):
                st.state = STOPPED
        self._save()

    def _save(self) -> None:
        if self.state_file is None:
            return
        with self._lock:
            data = {name: asdict(st) for name, st in self.states.items()}
        tmp = self.state_file.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(data, indent=2))
            os.replace(tmp, self.state_file)


def _kill_group(process: ServiceProcess) -> None:
    """Kill whatever is left of a dead child's process group (its own session)."""
    pid = process.pid
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)

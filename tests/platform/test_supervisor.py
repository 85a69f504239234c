"""The supervisor `loraplex up` runs its children under: a crashed child comes back with a new
pid; one that keeps crashing is reported with its log tail and given up on after a bounded
number of tries; the others keep running meanwhile."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess
from loraplex.platform.supervisor import GAVE_UP, RUNNING, Supervised, Supervisor

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
CRASHER = [sys.executable, "-c", "import sys; print('boom: bad config', flush=True); sys.exit(3)"]


def _wait(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _child(tmp_path: Path, name: str, argv: list[str]) -> Supervised:
    proc = ServiceProcess(name, tmp_path / f"{name}.log")
    proc.start(argv)
    return Supervised(name, proc, proc.start_again)


def test_crashed_child_is_restarted_and_a_crash_loop_is_given_up(tmp_path: Path) -> None:
    reports: list[str] = []
    state = tmp_path / "supervisor.json"
    sup = Supervisor(reports.append, max_restarts=3, backoff_base_s=0.05, poll_s=0.02,
                     state_file=state)  # fmt: skip
    steady = _child(tmp_path, "steady", SLEEPER)
    flaky = _child(tmp_path, "flaky", SLEEPER)
    broken = _child(tmp_path, "broken", CRASHER)
    for child in (steady, flaky, broken):
        sup.add(child)
    stop = threading.Event()
    thread = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    thread.start()
    try:
        first = flaky.process.pid
        flaky.process.proc.kill()  # kill -9
        _wait(lambda: sup.states["flaky"].restarts == 1 and flaky.process.running())
        assert flaky.process.pid != first and sup.states["flaky"].state == RUNNING
        _wait(lambda: sup.states["broken"].state == GAVE_UP)
        assert sup.states["broken"].restarts == 3
        given_up = [r for r in reports if r.startswith("broken keeps crashing")]
        assert (
            len(given_up) == 1
            and "boom: bad config" in given_up[0]
            and "exit code 3" in given_up[0]
        )
        assert steady.process.running() and sup.states["steady"].restarts == 0
        saved = json.loads(state.read_text())
        assert saved["flaky"]["pid"] == flaky.process.pid and saved["broken"]["state"] == GAVE_UP
        restarts_before = sup.states["broken"].restarts
        time.sleep(0.3)
        assert sup.states["broken"].restarts == restarts_before  # no more tries
    finally:
        stop.set()
        thread.join(5)
        sup.close()
        for child in (steady, flaky, broken):
            child.process.stop(timeout=5)


def test_backoff_doubles_up_to_a_cap() -> None:
    sup = Supervisor(lambda _: None, backoff_base_s=1.0, backoff_max_s=10.0)
    assert [sup.backoff_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]

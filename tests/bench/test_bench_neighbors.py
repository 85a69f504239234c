"""`loraplex bench neighbors` runs end to end on a short window, and its process helpers read
what they claim to."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from loraplex.bench import neighbors


def test_cpu_seconds_counts_a_process_and_its_children() -> None:
    before = neighbors.cpu_seconds(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    assert neighbors.cpu_seconds(os.getpid()) - before >= 0.15
    assert neighbors.cpu_seconds(2**22 + 12345) == 0.0  # no such process


def test_the_bystanders_threads_run_above_the_platforms_priority() -> None:
    got: list[int] = []

    def run() -> None:
        neighbors._raise_priority(-7)
        got.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if os.geteuid() != 0:
        pytest.skip("lowering a nice value needs root")
    assert got == [-7]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # this thread kept


def test_a_short_run_prints_each_result(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--seconds", "1", "--rounds", "2", "--attacks", "nested_json", "--no-all-at-once",
            "--upload-mb", "1"]  # fmt: skip
    cores = os.sched_getaffinity(0)
    try:
        assert neighbors.main(argv) == 0
    finally:
        os.sched_setaffinity(0, cores)  # it pins its own process: not the rest of the suite
    captured = capsys.readouterr()
    out = captured.out
    assert "nested_json (round 2 of 2)" in captured.err  # both rounds ran, pooled in one line
    got = dict(re.findall(r"^RESULT neighbors\.(\w+)=([-0-9.e+]+)$", out, flags=re.M))
    assert float(got["nested_json_bystander_ttft_p95_over_quiet"]) > 0
    assert float(got["nested_json_bystander_errors"]) == 0
    assert float(got["nested_json_api_cpu_cores"]) > 0  # the API answered the attack
    assert float(got["nested_json_quiet_api_cpu_cores"]) > 0  # and the bystander
    assert out.count("RESULT neighbors.nested_json_bystander_ttft_p95_over_quiet=") == 1


def test_rounds_are_at_least_one() -> None:
    with pytest.raises(SystemExit) as exited:
        neighbors.build_parser().parse_args(["--rounds", "0"])
    assert exited.value.code == 2
    assert neighbors.build_parser().parse_args(["--rounds", "3"]).rounds == 3


def test_flags_that_leave_no_window_are_refused_before_anything_starts() -> None:
    with pytest.raises(SystemExit) as exited:
        neighbors.main(["--only-all-at-once", "--no-all-at-once"])
    assert exited.value.code == 2


def test_the_attackers_client_runs_in_a_session_of_its_own_at_the_lowest_weight() -> None:
    """Where the kernel groups tasks by session (autogroup), a nice value ranks a thread only
    inside its session: the attacker's client must have a session of its own at the lowest
    weight, or its threads take as much of a shared core as the API's whole session."""
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()

    def child() -> None:
        attacker = object.__new__(neighbors.Attacker)
        attacker._threads([], 1, ctx.Event())  # no attack: only its priority is set
        group = Path("/proc/self/autogroup")
        text = group.read_text() if group.exists() else None
        death = ctypes.c_int(0)  # the signal the kernel sends it when the bench dies
        ctypes.CDLL(None).prctl(2, ctypes.byref(death))  # PR_GET_PDEATHSIG
        theirs.send((os.getsid(0), os.getpid(), os.nice(0), text, death.value))

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(30)
    sid, pid, nice, group, death = ours.recv()
    assert sid == pid != os.getsid(0)  # a session of its own (Ctrl-C no longer reaches it)
    assert death == signal.SIGTERM  # so it dies with the bench
    assert nice == 19
    if group is None:
        pytest.skip("this kernel does not group tasks by session")
    assert group.split()[-1] == "19"  # "/autogroup-N nice 19"


def test_the_bystanders_client_runs_in_a_session_of_its_own_above_the_platform() -> None:
    """Its nice value would rank its threads only inside the bench's session: the bystander's
    client gets a session of its own, weighted above the platform's (as root)."""
    bystander = neighbors.Bystander("http://127.0.0.1:9", "key", "model", streams=0, nice=-7)
    bystander.start()
    try:
        pid = bystander._proc.pid
        deadline = time.monotonic() + 30
        while os.getsid(pid) != pid:
            assert time.monotonic() < deadline, "the bystander kept the bench's session"
            time.sleep(0.01)
        group = Path(f"/proc/{pid}/autogroup")
        text = group.read_text() if group.exists() else None
    finally:
        assert bystander.stop() == ([], 0)
    if text is None:
        pytest.skip("this kernel does not group tasks by session")
    if os.geteuid() != 0:
        pytest.skip("a weight above the default needs root")
    assert text.split()[-1] == "-7"

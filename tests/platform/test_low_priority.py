"""CPU-heavy background work runs on threads the OS schedules after the event loop's."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from loraplex.platform.low_priority import NICE, run_low_priority


def _where() -> tuple[str, int]:
    return threading.current_thread().name, os.getpriority(
        os.PRIO_PROCESS, threading.get_native_id()
    )


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_the_pool_runs_below_the_loops_priority() -> None:
    name, nice = asyncio.run(run_low_priority(_where))
    assert name.startswith("low-priority")
    assert nice >= min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < nice  # the caller's stays


def test_sign_in_checks_run_on_the_low_priority_pool() -> None:
    from loraplex.api.console.pages_auth import _off_loop

    name = asyncio.run(_off_loop(lambda: threading.current_thread().name))
    assert name.startswith("low-priority")

"""The API's pools are sized to the cores the process may run on (its CPU affinity: a
cpuset, a pinned container), not to the machine's: on one allowed core of two, two password
checks or two text workers would only take turns with the event loop."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os
os.sched_setaffinity(0, range(os.cpu_count()))  # whatever this test process was pinned to
from loraplex.platform.cores import usable_cores
every = usable_cores()
os.sched_setaffinity(0, {0})
from loraplex.platform import low_priority
from loraplex.platform.gateway.text_work import TextWorkers
from loraplex.api.console import pages_auth
print(every == os.cpu_count(), usable_cores(), low_priority._pool._max_workers,
      TextWorkers(0, 8).workers, pages_auth._HASHING._value)
"""


def test_pools_follow_the_cores_this_process_may_use() -> None:
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        pytest.skip("needs CPU affinity and two cores")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == ["True", "1", "1", "1", "1"], out

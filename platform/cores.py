"""The number of cores this process may run on: its CPU affinity (a cpuset, a pinned
container, the bench's split), not the machine's count. Pools sized to the machine would
only take turns, and each turn delays the event loop they share a core with."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may be scheduled on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this OS
        return max(1, os.cpu_count() or 1)

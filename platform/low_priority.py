"""A thread pool for CPU-heavy work that no request is waiting on to stream (console sign-in's
argon2 checks): its threads run at a lower scheduling priority (nice +10 on Linux, per
thread), so on a busy core the event loop and the request path win the CPU and a flood of
such work slows itself, not the tenants' completions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from loraplex.platform.cores import usable_cores

NICE = 10
T = TypeVar("T")


def lower_priority() -> None:
    """Thread (or worker process) initializer: raise this thread's nice value (a no-op where
    the OS cannot)."""
    # Not Linux, or not allowed: normal priority then.
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


_pool = ThreadPoolExecutor(
    max_workers=usable_cores(),
    thread_name_prefix="low-priority",
    initializer=lower_priority,
)


async def run_low_priority(fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(*args)` on the low-priority pool and await its result."""
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args))


__all__ = ["NICE", "lower_priority", "run_low_priority"]

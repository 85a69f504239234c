"""The gateway's parse process: one child process that parses large request bodies
(`request_parsing.parse_elsewhere`), so their JSON never holds this process's GIL. It runs at
a lower scheduling priority (`platform/low_priority.py`): on a busy machine the request path
of every other request wins the CPU over a tenant's megabytes of JSON."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from loraplex.platform.low_priority import lower_priority

# How often the process checks that the gateway that started it is still there.
PARENT_POLL_S = 1.0


def _exit_with(parent: int) -> None:
    """In the process: exit once `parent` is gone. A parent killed outright (SIGKILL, the OOM
    killer) sends no shutdown, and the queue the process waits on never ends: it holds the
    queue's write end itself. (The kernel's parent-death signal would follow the thread that
    spawned it, which may be any worker thread.)"""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _prepare(preload: str | None) -> None:
    """In the process, as it starts: its end tied to its parent's, its priority lowered, and
    `preload` imported."""
    threading.Thread(
        target=_exit_with, args=(os.getppid(),), name="exit-with-parent", daemon=True
    ).start()
    lower_priority()
    if preload is not None:
        importlib.import_module(preload)


def _ready() -> None:
    """In the process: nothing (`start` sends it to have the process spawned)."""


class ParseProcess:
    """One process for CPU-heavy parsing, started by `start` or at its first use; `preload`:
    a module it imports as it starts (the parser), so no request waits for that."""

    def __init__(self, preload: str | None = None) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._preload = preload

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn: the API has threads running; a fork would copy their locks
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(
                    1, mp_context=context, initializer=_prepare, initargs=(self._preload,)
                )
            return self._pool

    def start(self) -> None:
        """Spawn the process now (does not wait): the first large body then finds it ready,
        instead of waiting for a process to start and import the parser (0.8-0.9 s here)."""
        self.post(_ready)

    def call(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` in the process (a module-level function; call from a worker thread:
        this waits for it)."""
        return self._executor().submit(fn, *args).result()

    def post(self, fn: Any, *args: Any) -> None:
        """`fn(*args)` in the process, not waited for (its result and errors are dropped)."""
        with contextlib.suppress(RuntimeError):  # closed, or shutting down: nothing to do
            self._executor().submit(fn, *args)

    def close(self) -> None:
        """Stop the process (calls waiting on it fail)."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

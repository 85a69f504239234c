"""Catch work that blocks an asyncio event loop: every callback the loop runs (each step of a
request's coroutine is one) is timed in CPU time of the loop's own thread, so waiting for
the GIL or for the machine does not count, only work done on the loop. A callback over the
threshold is reported with what it was running. Tests install it around the API's requests;
`LORAPLEX_LOOP_STALL_MS` logs such callbacks in a running server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stall:
    """One callback that held the loop: what it ran, and for how long (CPU ms)."""

    callback: str
    cpu_ms: float


_lock = threading.Lock()
_watchers: list[Callable[[Stall], None]] = []
_threshold_ms: float = float("inf")
_original_run: Callable[[asyncio.Handle], None] | None = None


def _describe(handle: asyncio.Handle) -> str:
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        if code is not None:
            return f"task {code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
    return repr(callback)[:200]


def _timed_run(self: asyncio.Handle) -> None:
    start = time.thread_time()
    try:
        assert _original_run is not None
        _original_run(self)
    finally:
        cpu_ms = (time.thread_time() - start) * 1000
        if cpu_ms > _threshold_ms:
            stall = Stall(_describe(self), round(cpu_ms, 1))
            for watcher in list(_watchers):
                watcher(stall)


def watch(threshold_ms: float, on_stall: Callable[[Stall], None]) -> Callable[[], None]:
    """Call `on_stall` for every callback, on any loop of this process, that holds its loop
    for more than `threshold_ms` of CPU time; returns the function that stops watching."""
    global _original_run, _threshold_ms
    with _lock:
        if _original_run is None:
            _original_run = asyncio.Handle._run
            asyncio.Handle._run = _timed_run  # type: ignore[method-assign]  # the one hook asyncio offers per callback
        _threshold_ms = min(_threshold_ms, threshold_ms)
        _watchers.append(on_stall)

    def stop() -> None:
        global _original_run, _threshold_ms
        with _lock:
            if on_stall in _watchers:
                _watchers.remove(on_stall)
            if not _watchers and _original_run is not None:
                asyncio.Handle._run = _original_run  # type: ignore[method-assign]
                _original_run = None
                _threshold_ms = float("inf")

    return stop


def log_stalls(threshold_ms: float) -> Callable[[], None]:
    """Log a warning for each callback over `threshold_ms` (a server's opt-in)."""

    def report(stall: Stall) -> None:
        log.warning("event loop held for %.1f ms of CPU by %s", stall.cpu_ms, stall.callback)

    return watch(threshold_ms, report)


def collect(threshold_ms: float) -> tuple[list[Stall], Callable[[], None]]:
    """Start collecting stalls into a list; returns the list and the stop function."""
    found: list[Stall] = []
    return found, watch(threshold_ms, found.append)


__all__ = ["Stall", "collect", "log_stalls", "watch"]

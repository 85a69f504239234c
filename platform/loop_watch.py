"""Catch work that blocks an asyncio event loop: every callback the loop runs (each step of a
request's coroutine is one) is timed in CPU time of the loop's own thread, so waiting for
the GIL or for the machine does not count, only work done on the loop. A callback over the
threshold is reported with what it was running. A garbage collection that happens to run
inside a callback is counted apart (`gc_ms`): it stalls the loop too, but is no work of the
callback's (the API freezes its startup heap so full collections stay short). Tests install it
around the API's requests; `LORAPLEX_LOOP_STALL_MS` logs such callbacks in a running server."""

from __future__ import annotations

import asyncio
import gc
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
    cpu_ms: float  # the callback's own work, collections excluded
    gc_ms: float = 0.0  # garbage collection that ran inside it


_lock = threading.Lock()
_watchers: list[Callable[[Stall], None]] = []
_threshold_ms: float = float("inf")
_original_run: Callable[[asyncio.Handle], None] | None = None
_gc = threading.local()  # per thread: CPU seconds spent collecting, and when one began


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc.began = time.thread_time()
    elif getattr(_gc, "began", None) is not None:
        _gc.total = getattr(_gc, "total", 0.0) + time.thread_time() - _gc.began
        _gc.began = None


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
    gc_before = getattr(_gc, "total", 0.0)
    try:
        assert _original_run is not None
        _original_run(self)
    finally:
        gc_ms = (getattr(_gc, "total", 0.0) - gc_before) * 1000
        cpu_ms = (time.thread_time() - start) * 1000 - gc_ms
        if cpu_ms + gc_ms > _threshold_ms:
            stall = Stall(_describe(self), round(cpu_ms, 1), round(gc_ms, 1))
            for watcher in list(_watchers):
                watcher(stall)


def watch(threshold_ms: float, on_stall: Callable[[Stall], None]) -> Callable[[], None]:
    """Call `on_stall` for every callback, on any loop of this process, that holds its loop
    for more than `threshold_ms` of CPU time (collections included; `Stall` says how much was
    collecting); returns the function that stops watching."""
    global _original_run, _threshold_ms
    with _lock:
        if _original_run is None:
            _original_run = asyncio.Handle._run
            asyncio.Handle._run = _timed_run  # type: ignore[method-assign]  # the one hook asyncio offers per callback
            gc.callbacks.append(_on_gc)
        _threshold_ms = min(_threshold_ms, threshold_ms)
        _watchers.append(on_stall)

    def stop() -> None:
        global _original_run, _threshold_ms
        with _lock:
            if on_stall in _watchers:
                _watchers.remove(on_stall)
            if not _watchers and _original_run is not None:
                asyncio.Handle._run = _original_run  # type: ignore[method-assign, assignment]  # puts the saved function back
                gc.callbacks.remove(_on_gc)
                _original_run = None
                _threshold_ms = float("inf")

    return stop


def log_stalls(threshold_ms: float) -> Callable[[], None]:
    """Log a warning for each callback that held the loop over `threshold_ms`, garbage
    collection included (a server's opt-in: every stall its clients feel)."""

    def report(stall: Stall) -> None:
        if stall.cpu_ms + stall.gc_ms > threshold_ms:
            log.warning(
                "event loop held for %.1f ms of CPU by %s (%.1f ms of it collecting garbage)",
                stall.cpu_ms + stall.gc_ms,
                stall.callback,
                stall.gc_ms,
            )

    return watch(threshold_ms, report)


def collect(threshold_ms: float) -> tuple[list[Stall], Callable[[], None]]:
    """Start collecting the callbacks whose own work (collections excluded) held the loop
    over `threshold_ms`; returns the list and the stop function."""
    found: list[Stall] = []

    def keep(stall: Stall) -> None:
        if stall.cpu_ms > threshold_ms:
            found.append(stall)

    return found, watch(threshold_ms, keep)


__all__ = ["Stall", "collect", "log_stalls", "watch"]

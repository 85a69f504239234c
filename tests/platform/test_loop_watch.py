"""The event-loop watch reports a callback that does CPU work on the loop, and not one that
only waits (sleeping, or waiting for a thread): its measure is the loop thread's CPU time."""

from __future__ import annotations

import asyncio
import hashlib
import time

from loraplex.platform.loop_watch import collect


def _burn(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    data = b"x" * 65536
    while time.thread_time() < end:
        hashlib.sha256(data).digest()


async def _blocking() -> None:
    _burn(120)


async def _waiting() -> None:
    await asyncio.sleep(0.2)
    await asyncio.to_thread(_burn, 120)


def test_cpu_work_on_the_loop_is_reported() -> None:
    stalls, stop = collect(50.0)
    try:
        asyncio.run(_blocking())
    finally:
        stop()
    assert len(stalls) == 1 and stalls[0].cpu_ms >= 100
    assert "_blocking" in stalls[0].callback


def test_waiting_is_not_reported() -> None:
    stalls, stop = collect(50.0)
    try:
        asyncio.run(_waiting())
    finally:
        stop()
    assert stalls == []
    after, stop = collect(50.0)
    stop()
    asyncio.run(_blocking())  # no longer watched
    assert after == []

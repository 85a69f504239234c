"""Concurrent requests that need the same answer share one call: a wave of streams arriving
together for one model or one key, after its cached answer expired, asks the database once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """One running call per key; callers that ask meanwhile await the same result (or error)."""

    def __init__(self) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}

    async def run(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        """`call()`'s result, shared with every caller of `key` while it runs. A caller that
        leaves (its client gone) does not cancel the call the others wait on."""
        running = self._running.get(key)
        if running is None:
            running = asyncio.ensure_future(call())
            self._running[key] = running
            running.add_done_callback(lambda fut: self._settled(key, fut))
        return await asyncio.shield(running)

    def running(self, key: K) -> bool:
        """Whether a call for `key` is under way."""
        return key in self._running

    def _settled(self, key: K, fut: asyncio.Future[V]) -> None:
        self._running.pop(key, None)
        if not fut.cancelled():
            fut.exception()  # retrieved here: every caller may have left

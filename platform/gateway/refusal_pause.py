"""Refused callers wait: a tenant past its rate limit or quota gets its 429 after a pause.

Answering a refused request costs the API almost as much as starting one (the connection, the
headers, the key, the limiter), so a tenant flooding past its limits would spend the API's CPU
at the rate its clients can send. Holding each refusal for `delay_s` first (a sleep: no CPU)
bounds that rate per connection; a tenant holding more than `max_held` paused refusals gets
the rest at once, so the pause never piles up memory. Well-behaved clients wait for
Retry-After anyway (it is at least a second), so they do not notice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

from loraplex.platform.errors import HttpError

T = TypeVar("T")


class RefusalPause:
    """Per-tenant pauses before 429 answers (bounded per tenant)."""

    def __init__(self, delay_s: float, max_held: int = 32) -> None:
        self.delay_s = delay_s
        self.max_held = max_held
        self._held: Counter[str] = Counter()

    async def pause(self, tenant: str) -> None:
        """Wait `delay_s` before `tenant`'s refusal is sent (at once past `max_held`)."""
        if self.delay_s <= 0 or self._held[tenant] >= self.max_held:
            return
        self._held[tenant] += 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self._held[tenant] -= 1
            if self._held[tenant] <= 0:
                del self._held[tenant]

    async def paused(self, tenant: str, charge: Awaitable[T]) -> T:
        """Await a limiter's `charge` for `tenant`; its 429 goes out after the pause."""
        try:
            return await charge
        except HttpError as exc:
            if exc.status == 429:
                await self.pause(tenant)
            raise

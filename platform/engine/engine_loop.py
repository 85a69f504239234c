"""Drives one EngineCore from asyncio: requests join and leave only between steps.

Between steps the loop applies queued adds and aborts on the event loop (so the engine is never
touched by two threads), then runs `EngineCore.step` in a worker thread and hands each delta to
its request's queue. The replica's HTTP API (`server.py`) sits on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from loraplex.platform.engine.ports import ServedEngine
from loraplex.platform.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class PendingAdd:
    """A request waiting for the next step boundary to join the engine."""

    prompt: str | list[int]
    params: SamplingParams
    request_id: str
    adapter: Any
    cache_salt: str | None
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class PendingWarm:
    """An adapter to bring into the host tier at the next step boundary."""

    adapter: Any
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


ABORTED_KEPT = 4096


class EngineLoop:
    """Drives one EngineCore from asyncio; owns the per-request delta queues."""

    def __init__(self, core: ServedEngine) -> None:
        self.core = core
        self.queues: dict[str, asyncio.Queue] = {}
        self._adds: list[PendingAdd] = []
        self._aborts: list[str] = []
        self._warms: list[PendingWarm] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # Prompt tokens computed by requests at their abort, kept a while for `/abort` calls
        # that arrive after the replica saw the client go (bounded: oldest dropped first).
        self._computed_at_abort: OrderedDict[str, int] = OrderedDict()
        self.error: str | None = None

    def start(self) -> None:
        """Start the background task."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop the background task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def alive(self) -> bool:
        """True while the loop task runs."""
        return self._task is not None and not self._task.done()

    async def add(self, add: PendingAdd) -> asyncio.Queue:
        """Queue a request for the next step boundary; raises what `add_request` raises."""
        if add.request_id in self.queues:
            raise KeyError(add.request_id)
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[add.request_id] = queue
        self._adds.append(add)
        self._wake.set()
        try:
            await add.done
        except BaseException:
            self.queues.pop(add.request_id, None)
            raise
        return queue

    async def warm(self, adapter: Any) -> str:
        """Warm `adapter` at the next step boundary (`ServedEngine.warm_adapter`'s answer);
        raises what it raises."""
        pending = PendingWarm(adapter)
        self._warms.append(pending)
        self._wake.set()
        return await pending.done

    def abort(self, request_id: str) -> bool:
        """Ask for an abort at the next step boundary; False for an unknown id."""
        if request_id not in self.queues:
            return False
        self._aborts.append(request_id)
        self._wake.set()
        return True

    def computed_prompt_tokens(self, request_id: str) -> int | None:
        """Prompt tokens computed for `request_id`: live, or at its abort; None if unknown."""
        if request_id in self.queues:
            live = self.core.computed_prompt_tokens(request_id)
            if live is not None:
                return live
        return self._computed_at_abort.get(request_id)

    def _apply_pending(self) -> None:
        warms, self._warms = self._warms, []
        for w in warms:
            try:
                outcome = self.core.warm_adapter(w.adapter)
            except Exception as exc:  # handed to the waiting handler, which answers 4xx
                if not w.done.done():
                    w.done.set_exception(exc)
                continue
            if not w.done.done():
                w.done.set_result(outcome)
        adds, self._adds = self._adds, []
        for a in adds:
            try:
                self.core.add_request(a.prompt, a.params, a.request_id, a.adapter, a.cache_salt)
            except Exception as exc:  # handed to the waiting handler, which answers 4xx
                if not a.done.done():
                    a.done.set_exception(exc)
                continue
            if not a.done.done():
                a.done.set_result(None)
            else:  # the client left before the add landed
                self._aborts.append(a.request_id)
        aborts, self._aborts = self._aborts, []
        for rid in aborts:
            computed = self.core.computed_prompt_tokens(rid)
            if self.core.abort_request(rid) and computed is not None:
                self._computed_at_abort[rid] = computed
                while len(self._computed_at_abort) > ABORTED_KEPT:
                    self._computed_at_abort.popitem(last=False)

    async def _run(self) -> None:
        while True:
            self._apply_pending()
            if not self.core.has_unfinished():
                self._wake.clear()
                if not self._adds and not self._aborts:
                    await self._wake.wait()
                continue
            try:
                deltas = await asyncio.to_thread(self.core.step)
            except Exception as exc:  # keep serving: fail the live requests, free their blocks
                log.exception("engine step failed")
                self.error = f"engine step failed: {exc}"
                for rid, q in list(self.queues.items()):
                    self.core.abort_request(rid)
                    q.put_nowait(exc)
                continue
            for d in deltas:
                out = self.queues.get(d.request_id)
                if out is not None:
                    out.put_nowait(d)
                    if d.finished:
                        self.queues.pop(d.request_id, None)
            if not deltas and self.core.last_num_scheduled_tokens == 0:
                await self._idle_wait()  # requests wait on something else (an adapter load)

    async def _idle_wait(self, seconds: float = 0.005) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

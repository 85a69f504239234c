"""Drives one EngineCore from a thread of its own; the replica's asyncio server talks to it.

The stepping thread is the only one that changes the engine: between steps it applies the
adds, aborts and warms the server queued, then runs `EngineCore.step` and hands the step's
deltas to the event loop in one call (`call_soon_threadsafe`), where each lands in its
request's queue. Steps follow each other without waiting for the event loop: a loop busy
writing the last step's frames to 64 streams no longer holds back the next step, and every
step runs on one thread (one OpenMP team, as offline). The replica's HTTP API (`server.py`)
sits on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.ports import ServedEngine
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.wire_mapping import adapter_reference, sampling_params
from loraplex.platform.wire import GenerateRequest

log = logging.getLogger(__name__)

DeltaQueue = asyncio.Queue[RequestDelta | Exception]
"""A request's stream: its deltas, or the error that ended it."""


@dataclass
class PendingAdd:
    """A wire request waiting for the next step boundary, where the engine makes it its
    `Request` (the one change of form on the replica); `params`: its sampling as the engine
    checked it (`wire_mapping.sampling_params`)."""

    wire: GenerateRequest
    params: SamplingParams
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @classmethod
    def of(cls, wire: GenerateRequest) -> PendingAdd:
        """The add for `wire`; raises ValueError for a sampling value the engine refuses."""
        return cls(wire, sampling_params(wire.sampling))

    @property
    def request_id(self) -> str:
        """The gateway's id of the request."""
        return self.wire.request_id


@dataclass
class PendingWarm:
    """An adapter to bring into the host tier at the next step boundary."""

    adapter: Any
    done: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


ABORTED_KEPT = 4096
IDLE_POLL_S = 0.005  # requests waiting on something else (an adapter load): look again soon
STOP_WAIT_S = 30.0


class EngineLoop:
    """Runs one engine's steps on a thread of its own; owns the per-request delta queues
    (event-loop side)."""

    def __init__(self, core: ServedEngine) -> None:
        self.core = core
        self.queues: dict[str, DeltaQueue] = {}
        self._lock = threading.Lock()  # guards the pending lists and `_computed_at_abort`
        self._adds: list[PendingAdd] = []
        self._aborts: list[str] = []
        self._warms: list[PendingWarm] = []
        # steps' deltas not yet taken by the event loop, and whether a drain is scheduled
        self._outbox: list[Sequence[RequestDelta]] = []
        self._drain_due = False
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Prompt tokens computed by requests at their abort, kept a while for `/abort` calls
        # that arrive after the replica saw the client go (bounded: oldest dropped first).
        self._computed_at_abort: OrderedDict[str, int] = OrderedDict()
        self.error: str | None = None

    def start(self) -> None:
        """Start the stepping thread (call from the event loop that serves the requests)."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-steps", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the stepping thread after its current step."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, STOP_WAIT_S)

    @property
    def alive(self) -> bool:
        """True while the stepping thread runs."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    async def add(self, add: PendingAdd) -> DeltaQueue:
        """Queue a request for the next step boundary; raises what `add_request` raises."""
        if add.request_id in self.queues:
            raise KeyError(add.request_id)
        queue: DeltaQueue = asyncio.Queue()
        self.queues[add.request_id] = queue
        self._post(self._adds, add)
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
        self._post(self._warms, pending)
        return await pending.done

    def abort(self, request_id: str) -> bool:
        """Ask for an abort at the next step boundary; False for an unknown id."""
        if request_id not in self.queues:
            return False
        self._post(self._aborts, request_id)
        return True

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer (logprob token text)."""
        return self.core.tokenizer

    async def state_json(self) -> str:
        """The engine's `/state` document."""
        return self.core.state().model_dump_json()

    async def metrics_exposition(self) -> bytes:
        """The engine's Prometheus exposition."""
        return self.core.metrics.render()

    def close(self) -> None:
        """Release the engine (after `stop`)."""
        self.core.close()

    async def prompt_tokens_computed(self, request_id: str) -> int | None:
        """Prompt tokens computed for `request_id`: live, or at its abort; None if unknown
        (awaited, as `EngineProcess` answers it)."""
        if request_id in self.queues:
            live = self.core.computed_prompt_tokens(request_id)
            if live is not None:
                return live
        with self._lock:
            return self._computed_at_abort.get(request_id)

    def _post(self, pending: list[Any], item: Any) -> None:
        with self._lock:
            pending.append(item)
        self._wake.set()

    # ---------------------------------------------------------------- the stepping thread

    def _on_loop(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the event loop (from the stepping thread)."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the event loop is closing
            self._loop.call_soon_threadsafe(fn, *args)

    def _settle(self, fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
        if not fut.done():  # else the server stopped waiting
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)

    def _settle_add(self, add: PendingAdd, exc: BaseException | None) -> None:
        if add.done.done():  # the client left before the add landed: drop the request
            if exc is None:
                self._post(self._aborts, add.request_id)
            return
        self._settle(add.done, None, exc)

    def _apply_pending(self) -> None:
        with self._lock:
            warms, self._warms = self._warms, []
            adds, self._adds = self._adds, []
            aborts, self._aborts = self._aborts, []
        for w in warms:
            try:
                outcome = self.core.warm_adapter(w.adapter)
            except Exception as exc:  # handed to the waiting handler, which answers 4xx
                self._on_loop(self._settle, w.done, None, exc)
                continue
            self._on_loop(self._settle, w.done, outcome, None)
        for a in adds:
            try:
                wire = a.wire
                ref = adapter_reference(wire.adapter)
                self.core.add_request(
                    wire.prompt_token_ids, a.params, wire.request_id, ref, wire.cache_salt
                )
            except Exception as exc:  # handed to the waiting handler, which answers 4xx
                self._on_loop(self._settle_add, a, exc)
                continue
            self._on_loop(self._settle_add, a, None)
        for rid in aborts:
            computed = self.core.computed_prompt_tokens(rid)
            if self.core.abort_request(rid) and computed is not None:
                with self._lock:
                    self._computed_at_abort[rid] = computed
                    while len(self._computed_at_abort) > ABORTED_KEPT:
                        self._computed_at_abort.popitem(last=False)

    def _run(self) -> None:
        while not self._stopping:
            self._apply_pending()
            if not self.core.has_unfinished():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                deltas = self.core.step()
            except Exception as exc:  # keep serving: fail the live requests, free their blocks
                log.exception("engine step failed")
                self.error = f"engine step failed: {exc}"
                failed = list(self.queues)  # a copy under the GIL: the loop may be adding
                for rid in failed:
                    self.core.abort_request(rid)
                self._on_loop(self._fail, failed, exc)
                continue
            if deltas:
                self._hand_over(deltas)
            elif self.core.last_num_scheduled_tokens == 0:
                self._wake.wait(IDLE_POLL_S)
                self._wake.clear()
        with self._lock:  # stopping: the aborts asked for still free their requests
            aborts, self._aborts = self._aborts, []
        for rid in aborts:
            self.core.abort_request(rid)

    def _hand_over(self, deltas: Sequence[RequestDelta]) -> None:
        """Give a step's deltas to the event loop, waking it only when no hand-over is still
        waiting there: a wake-up costs this thread a system call and the GIL while the loop
        runs, so steps that finish while the loop is busy join the waiting one."""
        with self._lock:
            self._outbox.append(deltas)
            if self._drain_due:
                return
            self._drain_due = True
        self._on_loop(self._drain)

    # ---------------------------------------------------------------- the event loop's side

    def _drain(self) -> None:
        with self._lock:
            batches, self._outbox = self._outbox, []
            if not batches:
                self._drain_due = False
                return
        for deltas in batches:
            self._deliver(deltas)
        # Look again once the streams this woke have written their frames: a step that ends
        # meanwhile is taken then, without a wake-up.
        assert self._loop is not None
        self._loop.call_soon(self._drain)

    def _deliver(self, deltas: Sequence[RequestDelta]) -> None:
        for d in deltas:
            out = self.queues.get(d.request_id)
            if out is not None:
                out.put_nowait(d)
                if d.finished:
                    self.queues.pop(d.request_id, None)

    def _fail(self, request_ids: list[str], exc: Exception) -> None:
        for rid in request_ids:
            q = self.queues.pop(rid, None)
            if q is not None:
                q.put_nowait(exc)

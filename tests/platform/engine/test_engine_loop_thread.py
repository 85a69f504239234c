"""The replica's engine loop steps the engine on one thread of its own: steps follow each other
while the event loop is busy (writing the last step's frames to many streams), every step runs
on the same thread, and adds, aborts and results cross between the two as before."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from loraplex.platform.engine.engine_loop import EngineLoop, PendingAdd
from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.wire import GenerateRequest


class _Core:
    """An engine stand-in: each request yields `tokens` one-token deltas, one per step."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.left: dict[str, int] = {}
        self.steps = 0
        self.step_threads: set[int] = set()
        self.last_num_scheduled_tokens = 0
        self.aborted: list[str] = []

    def add_request(self, prompt: Any, params: Any, rid: str, adapter: Any, salt: Any) -> None:
        if rid == "bad":
            raise ValueError("refused")
        self.left[rid] = self.tokens

    def abort_request(self, rid: str) -> bool:
        self.aborted.append(rid)
        return self.left.pop(rid, None) is not None

    def computed_prompt_tokens(self, rid: str) -> int | None:
        return 3 if rid in self.left else None

    def has_unfinished(self) -> bool:
        return bool(self.left)

    def warm_adapter(self, ref: Any) -> str:
        return "on_host"

    def step(self) -> list[RequestDelta]:
        self.steps += 1
        self.step_threads.add(threading.get_ident())
        time.sleep(0.001)
        out = []
        for rid in list(self.left):
            self.left[rid] -= 1
            done = self.left[rid] == 0
            out.append(
                RequestDelta(rid, [1], "x", finished=done, finish_reason="length" if done else None)
            )
            if done:
                del self.left[rid]
        self.last_num_scheduled_tokens = len(out)
        return out


def test_steps_go_on_while_the_event_loop_is_busy() -> None:
    async def main() -> tuple[int, int, _Core, list[RequestDelta]]:
        core = _Core(tokens=10_000)
        loop = EngineLoop(core)  # type: ignore[arg-type]  # a stand-in engine
        loop.start()
        queue = await loop.add(
            PendingAdd(GenerateRequest(request_id="r", prompt_token_ids=[1, 2]), SamplingParams())
        )
        before = core.steps
        time.sleep(0.3)  # the event loop is held (as by a burst of frames to write)
        during = core.steps - before
        await asyncio.sleep(0.05)  # the deltas handed over meanwhile land in the queue
        loop.abort("r")
        got = []
        while not queue.empty():
            got.append(queue.get_nowait())
        await loop.stop()
        return before, during, core, got

    _, during, core, got = asyncio.run(main())
    assert during >= 20, during  # the old loop stepped only when the event loop let it
    assert len(core.step_threads) == 1  # one stepping thread: one OpenMP team
    assert threading.get_ident() not in core.step_threads
    assert "r" in core.aborted and got and all(d.request_id == "r" for d in got)


def test_adds_warms_refusals_and_results_cross_threads() -> None:
    async def main() -> tuple[list[RequestDelta], str, str, int | None]:
        core = _Core(tokens=3)
        loop = EngineLoop(core)  # type: ignore[arg-type]  # a stand-in engine
        loop.start()
        queue = await loop.add(
            PendingAdd(GenerateRequest(request_id="a", prompt_token_ids=[1]), SamplingParams())
        )
        got = [await queue.get() for _ in range(3)]
        warmed = await loop.warm(object())
        try:
            await loop.add(
                PendingAdd(
                    GenerateRequest(request_id="bad", prompt_token_ids=[1]), SamplingParams()
                )
            )
            refused = ""
        except ValueError as exc:
            refused = str(exc)
        await loop.stop()
        return got, warmed, refused, await loop.prompt_tokens_computed("a")

    got, warmed, refused, computed = asyncio.run(main())
    assert [d.finished for d in got] == [False, False, True]
    assert warmed == "on_host"
    assert refused == "refused"
    assert computed is None  # finished: neither live nor aborted


def test_steps_that_end_while_the_loop_is_busy_do_not_each_wake_it() -> None:
    """A wake-up (`call_soon_threadsafe`) costs the stepping thread a system call and the GIL
    while the loop runs: steps ending while a hand-over still waits on the loop join it, and
    every delta still arrives, in order."""

    async def main() -> tuple[int, int, list[RequestDelta]]:
        core = _Core(tokens=10_000)
        loop = EngineLoop(core)  # type: ignore[arg-type]  # a stand-in engine
        aio = asyncio.get_running_loop()
        wakes = 0
        real = aio.call_soon_threadsafe

        def counted(*args: Any, **kw: Any) -> Any:
            nonlocal wakes
            if threading.get_ident() != main_thread:
                wakes += 1
            return real(*args, **kw)

        main_thread = threading.get_ident()
        aio.call_soon_threadsafe = counted  # type: ignore[method-assign]  # counting wake-ups
        loop.start()
        queue = await loop.add(PendingAdd(GenerateRequest(request_id="r", prompt_token_ids=[1]),
                                          SamplingParams()))  # fmt: skip
        await asyncio.sleep(0.02)
        before_wakes, before_steps = wakes, core.steps
        time.sleep(0.3)  # the event loop is held
        busy_wakes, busy_steps = wakes - before_wakes, core.steps - before_steps
        await asyncio.sleep(0.05)
        loop.abort("r")
        await loop.stop()
        got = []
        while not queue.empty():
            got.append(queue.get_nowait())
        return busy_wakes, busy_steps, got

    wakes, steps, got = asyncio.run(main())
    assert steps >= 20, steps
    assert wakes <= 3, (wakes, steps)  # one per step before
    assert len(got) >= steps  # nothing lost: every step's delta reached the queue

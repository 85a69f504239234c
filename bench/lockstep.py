"""Throughput ratios of engines run in lockstep: one step of each in turn, over the same work.

On a machine whose speed drifts by tens of percent from one second to the next, two whole runs
timed one after the other compare the machine as much as the engines. Here every engine gets
the same prompts and the same number of output tokens; a round steps each unfinished engine
once, in an order that rotates each round, and an engine's time is the sum of its own steps.
A step lasts milliseconds, so a slow stretch of the machine lands on every engine of the round
alike, and the ratio of two sums is the ratio of their throughputs on this workload (prefill
and decode alike). `bench peer` reports its `*_over_base` figures this way.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol


class SteppedEngine(Protocol):
    """What lockstep needs of an engine (`EngineCore` is one)."""

    def add_request(
        self, prompt: Any, params: Any = None, request_id: str | None = None, adapter: Any = None
    ) -> Any: ...

    def step(self) -> list[Any]: ...

    def has_unfinished(self) -> bool: ...


_calls = itertools.count()  # request ids stay unique when one engine serves several calls


def lockstep_times(
    engines: Mapping[str, SteppedEngine],
    prompts: Sequence[Any],
    adapters: Mapping[str, Sequence[Any]],
    params: Any,
    expected_tokens: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Seconds each engine spent in its own steps serving `prompts` (engine `k` with the
    per-prompt adapter references `adapters[k]`). Raises RuntimeError unless every engine
    produced `expected_tokens` output tokens, so the times compare equal work."""
    tokens = dict.fromkeys(engines, 0)
    spent = dict.fromkeys(engines, 0.0)
    call = next(_calls)
    for name, engine in engines.items():
        for i, prompt in enumerate(prompts):
            engine.add_request(prompt, params, f"lockstep-{call}-{i}", adapters[name][i])
    active = [name for name in engines if engines[name].has_unfinished()]
    rnd = 0
    while active:
        shift = rnd % len(active)
        for name in active[shift:] + active[:shift]:
            t0 = clock()
            deltas = engines[name].step()
            spent[name] += clock() - t0
            tokens[name] += sum(len(d.new_token_ids) for d in deltas)
        active = [name for name in active if engines[name].has_unfinished()]
        rnd += 1
    wrong = {k: n for k, n in tokens.items() if n != expected_tokens}
    if wrong:
        raise RuntimeError(
            f"expected {expected_tokens} output tokens from each engine, got {wrong}"
        )
    return spent


def ratios_over(times: dict[str, float], baseline: str) -> dict[str, float]:
    """Each engine's throughput over the baseline's (`times[baseline] / times[k]`)."""
    return {k: times[baseline] / t for k, t in times.items() if k != baseline}

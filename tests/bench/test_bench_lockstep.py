"""Lockstep timing: each engine's own step times summed while all step in turn, on a clock the
test controls, and a refusal when the engines did unequal work."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from loraplex.bench.lockstep import lockstep_times, ratios_over


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Delta:
    new_token_ids: list[int]


@dataclass
class Engine:
    """Serves each request `tokens` tokens, one per step for every request; a step costs
    `cost` seconds on the shared clock."""

    clock: Clock
    cost: float
    tokens: int
    order: list[str]
    name: str
    left: dict[str, int] = field(default_factory=dict)
    adapters: list[object] = field(default_factory=list)

    def add_request(self, prompt, params=None, request_id=None, adapter=None):  # noqa: ANN001, ANN201
        self.left[request_id] = self.tokens
        self.adapters.append(adapter)

    def step(self) -> list[Delta]:
        self.order.append(self.name)
        self.clock.now += self.cost
        out = [Delta([1]) for rid, n in self.left.items() if n > 0]
        self.left = {rid: n - 1 for rid, n in self.left.items() if n > 1}
        return out

    def has_unfinished(self) -> bool:
        return bool(self.left)


def test_times_are_each_engines_own_steps_and_the_order_rotates() -> None:
    clock, order = Clock(), []
    engines = {
        "base": Engine(clock, 1.0, 4, order, "base"),
        "lora": Engine(clock, 1.25, 4, order, "lora"),
        "slow": Engine(clock, 2.0, 4, order, "slow"),
    }
    refs = {"base": [None, None], "lora": ["a", "b"], "slow": ["a", "a"]}
    times = lockstep_times(engines, ["p", "q"], refs, None, expected_tokens=8, clock=clock)
    assert times == {"base": 4.0, "lora": 5.0, "slow": 8.0}
    assert ratios_over(times, "base") == {"lora": 0.8, "slow": 0.5}
    assert engines["lora"].adapters == ["a", "b"]
    assert order[:3] == ["base", "lora", "slow"] and order[3:6] == ["lora", "slow", "base"]


def test_unequal_work_is_refused() -> None:
    clock, order = Clock(), []
    engines = {"base": Engine(clock, 1.0, 3, order, "base"), "x": Engine(clock, 1.0, 2, order, "x")}
    with pytest.raises(RuntimeError, match="expected 6 output tokens"):
        lockstep_times(engines, ["p", "q"], {"base": [None] * 2, "x": [None] * 2}, None, 6, clock)

"""The K controller: the step-cost fit, drafts where they raise tokens per second (small
batches, good acceptance) and none where they would not (large batches, poor acceptance), the
draft budget and K bounds; and a step where the controller gives K = 0 does no proposer work
and runs the plain decode path."""

from __future__ import annotations

import pytest

from loraplex.platform.engine.block_pool import BlockPool
from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.scheduler import Scheduler
from loraplex.platform.engine.speculative import SpecConfig
from loraplex.platform.engine.speculative.controller import Controller, StepCostModel
from loraplex.platform.engine.speculative.guard import DraftGuard
from loraplex.platform.engine.speculative.speculator import Speculator


def fitted(c0: float, c1: float, sizes: list[int]) -> Controller:
    ctl = Controller(0, 5)
    for _ in range(5):
        for n in sizes:
            ctl.costs.observe(n, c0 + c1 * n)
    return ctl


def test_step_cost_model_recovers_fixed_and_per_token_costs():
    model = StepCostModel()
    assert model.coefficients() is None
    for n in [1, 3, 6, 1, 2, 5] * 4:
        model.observe(n, 0.010 + 0.0005 * n)
    c0, c1 = model.coefficients()
    assert c0 == pytest.approx(0.010, rel=1e-6) and c1 == pytest.approx(0.0005, rel=1e-6)


def test_drafts_at_small_batches_with_good_acceptance():
    ctl = fitted(0.010, 0.0005, [1, 3, 6])  # fixed cost = 20 tokens' work
    assert ctl.choose([0.8], 1, 1, 100) == [5]
    assert ctl.choose([None, 0.9, 0.05], 3, 3, 100)[1] == 5
    assert ctl.choose([0.03], 1, 1, 100) == [0]  # poor acceptance: no draft pays


def test_no_drafts_where_per_token_cost_dominates():
    ctl = fitted(0.001, 0.0005, [64, 96, 128])  # batch 64: fixed cost = 2 tokens' work
    assert ctl.choose([0.8] * 64, 64, 64, 1000) == [0] * 64
    assert ctl.choose([0.999] * 64, 64, 64, 1000) != [0] * 64  # near-certain drafts still pay


def test_budget_and_bounds():
    ctl = fitted(0.010, 0.0001, [1, 4, 8])
    ks = ctl.choose([0.95] * 4, 4, 4, 7)
    assert sum(ks) == 7 and max(ks) <= 5
    assert Controller(2, 3).choose([0.0, 0.0], 2, 2, 100) == [3, 3]  # nothing measured: full K
    assert fitted(1.0, 1e-9, [1, 2]).choose([0.99], 1, 1, 100) == [5]
    assert Controller(1, 4, adaptive=False).choose([0.0] * 3, 3, 3, 100) == [4, 4, 4]


def test_a_step_given_k0_does_no_proposer_work():
    pool = BlockPool(256)
    kv = KVCacheManager(pool, 4, "m")
    sched = Scheduler(kv, 64, 4096, 256)
    spec = Speculator(SpecConfig(), kv, 4096, 256)
    for _ in range(5):
        for n in (64, 96, 128):
            spec.controller.costs.observe(n, 0.0001 + 0.0005 * n)
    for i in range(64):
        params = SamplingParams(temperature=0.0, max_tokens=50)
        sched.add_request(Request(f"r{i}", [5, 6, 7, 5, 6, 7, 5, 6], params))
    first = sched.schedule()  # the prefill, run without speculation
    sched.update(first, {s.request.request_id: 5 for s in first.scheduled})
    out = sched.schedule()  # a batch-64 decode step
    assert len(out.scheduled) == 64 and out.num_tokens == 64
    free = pool.num_free_blocks
    assert spec.plan(out) == 0
    assert not spec._indexes  # no n-gram index was even built
    assert all(not s.request.spec_token_ids for s in out.scheduled)
    assert pool.num_free_blocks == free  # no lookahead block taken


def test_guard_turns_drafting_off_where_it_measured_slower_and_re_measures():
    guard = DraftGuard(explore=8)
    assert guard.allows(32)  # nothing measured: measure drafting first
    guard.record(32, True, 0.050, 40)  # 1.25 ms per token with drafts
    assert not guard.allows(32)  # then measure the plain step
    guard.record(32, False, 0.032, 32)  # 1.0 ms per token without
    modes = [guard.allows(32) for _ in range(32)]
    assert sum(modes) == 3  # drafting only on exploration steps: 8, 16, then 32 apart
    assert guard.allows(1)  # another batch-size bucket is measured on its own
    guard.record(1, True, 0.010, 4)
    guard.record(1, False, 0.008, 1)
    assert sum(guard.allows(1) for _ in range(16)) >= 14  # drafting pays at batch 1
    assert guard.seconds_per_token(32) == pytest.approx((0.05 / 40, 0.001))


def test_guard_leaves_small_batches_to_the_controller():
    """Below MIN_BATCH the guard never switches drafting off: a few requests whose acceptance
    changes by phase made its per-bucket average stop drafting where it paid."""
    from loraplex.platform.engine.speculative.guard import MIN_BATCH

    guard = DraftGuard(explore=8)
    for batch in range(1, MIN_BATCH):
        guard.record(batch, True, 0.040, 1)  # drafting measured 5x slower per token
        guard.record(batch, False, 0.008, 1)
        assert all(guard.allows(batch) for _ in range(16))
    guard.record(MIN_BATCH, True, 0.040, 1)
    guard.record(MIN_BATCH, False, 0.008, 1)
    assert sum(guard.allows(MIN_BATCH) for _ in range(16)) == 2  # exploration only


def test_with_a_draft_model_the_guard_judges_small_batches_too():
    """A draft model's forwards cost a step's worth each, which the controller's linear model
    of the target's step cannot see: the guard then measures every batch size, batch 1 too
    (before, a draft model that cost more than it saved ran at 0.45x at batch 1)."""
    guard = DraftGuard(explore=8, min_batch=1)
    guard.record(1, True, 0.040, 2)  # 20 ms per token with drafts
    guard.record(1, False, 0.008, 1)  # 8 ms without
    assert sum(guard.allows(1) for _ in range(16)) == 2  # exploration only


def test_guard_explores_less_often_while_each_exploration_confirms_its_choice():
    """Each exploration that confirms the choice doubles the wait before the next (a drafting
    step can cost several plain steps: exploring every 32 steps cost 12% at batch 1 with a
    draft model); one that changes it starts over at `explore`."""
    guard = DraftGuard(explore=8, min_batch=1)
    guard.allows(1)
    guard.record(1, True, 0.040, 2)  # drafting: 20 ms per token
    guard.allows(1)
    guard.record(1, False, 0.008, 1)  # plain: 8 ms
    explored = []
    for step in range(8 + 16 + 32 + 64):
        if guard.allows(1):
            explored.append(step)
            guard.record(1, True, 0.040, 2)
        else:
            guard.record(1, False, 0.008, 1)
    assert len(explored) == 4  # at 8, 16, 32 and 64 steps apart, not every 8 (15)
    # drafting turns fast: the next exploration switches it on, and the plain mode is
    # explored every `explore` steps again
    modes = []
    for _ in range(400):
        drafting = guard.allows(1)
        modes.append(drafting)
        guard.record(1, drafting, 0.004 if drafting else 0.008, 2 if drafting else 1)
    assert modes.index(True) < 128  # at the next exploration: the interval had grown to 128
    assert 90 <= sum(modes[-100:]) < 100  # drafting now, the plain mode explored

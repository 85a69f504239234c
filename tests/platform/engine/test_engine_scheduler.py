"""Scheduler invariants, driven by a cheap fake "model" (a hash of the context).

The fake model's next token depends only on the tokens before it, like a real model, so
preemption/resume and batching must not change any request's output here either.
"""

from __future__ import annotations

import random

import pytest

from loraplex.platform.engine.block_pool import BlockPool
from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request, RequestStatus
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.scheduler import Scheduler, SchedulerOutput

BS = 4
EOS = 0


def fake_next(tokens: list[int]) -> int:
    return (sum(t * (i + 7) for i, t in enumerate(tokens[-5:])) + len(tokens)) % 97 + 1


def make_sched(num_blocks: int = 64, **kw: object) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), BS, "fake")
    args = dict(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=64)
    args.update(kw)
    return Scheduler(kv, **args)


def fake_step(sched: Scheduler) -> tuple[SchedulerOutput, list[Request]]:
    out = sched.schedule()
    sampled = {}
    for s in out.scheduled:
        assert s.start == s.request.num_computed_tokens
        if s.samples:
            sampled[s.request.request_id] = fake_next(s.request.all_token_ids)
    return out, sched.update(out, sampled)


def check_invariants(sched: Scheduler, out: SchedulerOutput) -> None:
    pool = sched.kv.pool
    assert out.num_tokens <= sched.max_num_batched_tokens
    assert len(sched.running) <= sched.max_num_seqs
    held = [b for r in sched.running for b in r.block_ids]
    assert sum(b.ref_cnt for b in pool.blocks) == len(held)
    assert pool.num_free_blocks == sum(1 for b in pool.blocks if b.ref_cnt == 0)
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING
        assert len(r.block_ids) == -(-r.num_computed_tokens // BS)
        assert len(set(r.block_ids)) == len(r.block_ids)
    for r in sched.waiting:
        assert r.block_ids == [] and r.num_computed_tokens == 0
    assert sched.kv.num_requests() == len(sched.running)
    assert set(sched.requests) == {r.request_id for r in [*sched.running, *sched.waiting]}


def run_alone(prompt: list[int], max_tokens: int) -> list[int]:
    sched = make_sched()
    req = Request("x", list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    sched.add_request(req)
    while sched.has_unfinished():
        fake_step(sched)
    return req.output_token_ids


@pytest.mark.parametrize("chunked", [True, False])
def test_no_block_leaks_under_random_add_abort_finish(chunked: bool) -> None:
    rng = random.Random(1234 + chunked)
    sched = make_sched(
        num_blocks=40,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=32 if chunked else 64,
    )
    prefixes = [[rng.randrange(1, 90) for _ in range(12)] for _ in range(3)]
    all_reqs: list[Request] = []
    finished = 0
    for event in range(3000):
        roll = rng.random()
        if roll < 0.25:
            prompt = list(rng.choice(prefixes)) if rng.random() < 0.5 else []
            prompt += [rng.randrange(1, 90) for _ in range(rng.randrange(1, 30))]
            salt = rng.choice([None, "t1", "t2"])
            params = SamplingParams(max_tokens=rng.randrange(1, 20), ignore_eos=rng.random() < 0.5)
            req = Request(f"r{event}", prompt, params, frozenset({EOS, 5}), cache_salt=salt)
            sched.add_request(req)
            all_reqs.append(req)
        elif roll < 0.35 and sched.requests:
            rid = rng.choice(sorted(sched.requests))
            req = sched.finish_request(rid, RequestStatus.FINISHED_ABORTED)
            assert req is not None and req.block_ids == []
        else:
            out, done = fake_step(sched)
            finished += len(done)
            check_invariants(sched, out)
    while sched.has_unfinished():
        out, done = fake_step(sched)
        finished += len(done)
        check_invariants(sched, out)
    pool = sched.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    assert finished > 100
    assert all(r.is_finished for r in all_reqs)
    for r in all_reqs:
        if r.status != RequestStatus.FINISHED_ABORTED:
            assert 1 <= r.num_output_tokens <= r.sampling_params.max_tokens


def test_chunked_prefill_keeps_decodes_running() -> None:
    sched = make_sched(max_num_batched_tokens=16, max_model_len=128, num_blocks=64)
    short = Request("short", [1, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True))
    sched.add_request(short)
    fake_step(sched)
    long = Request("long", list(range(1, 61)), SamplingParams(max_tokens=2, ignore_eos=True))
    sched.add_request(long)
    chunks = []
    while long.num_output_tokens == 0:
        out, _ = fake_step(sched)
        ids = [s.request.request_id for s in out.scheduled]
        assert "short" in ids  # the running stream gets a token every step
        chunks += [s.num_tokens for s in out.scheduled if s.request is long]
    assert sum(chunks) == 60 and max(chunks) <= 15 and len(chunks) >= 4


def test_unchunked_prefill_runs_prompt_in_one_step() -> None:
    sched = make_sched(max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False)
    long = Request("long", list(range(1, 61)), SamplingParams(max_tokens=2, ignore_eos=True))
    sched.add_request(long)
    out, _ = fake_step(sched)
    assert [s.num_tokens for s in out.scheduled] == [60]


def test_preemption_by_recompute_resumes_with_same_output() -> None:
    prompts = [[i + 1] * 6 + [i + 2] * 5 for i in range(6)]
    expected = [run_alone(p, 20) for p in prompts]
    sched = make_sched(num_blocks=14)  # far fewer than 6 requests x 8 blocks
    reqs = [
        Request(f"p{i}", list(p), SamplingParams(max_tokens=20, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]
    for r in reqs:
        sched.add_request(r)
    while sched.has_unfinished():
        out, _ = fake_step(sched)
        check_invariants(sched, out)
    assert sched.num_preemptions > 0
    assert sum(r.num_preemptions for r in reqs) == sched.num_preemptions
    assert [r.output_token_ids for r in reqs] == expected
    assert sched.kv.pool.num_free_blocks == 14


def test_max_num_seqs_and_budget_respected() -> None:
    sched = make_sched(max_num_seqs=3, max_num_batched_tokens=10)
    for i in range(6):
        sched.add_request(Request(f"r{i}", [i + 1] * 4, SamplingParams(max_tokens=3)))
    out, _ = fake_step(sched)
    assert len(out.scheduled) == 3 and out.num_tokens == 10  # 4 + 4 + 2 (chunk)
    assert sched.num_running == 3 and sched.num_waiting == 3


def test_abort_frees_blocks_at_once() -> None:
    sched = make_sched()
    req = Request("a", list(range(1, 20)), SamplingParams(max_tokens=10))
    sched.add_request(req)
    fake_step(sched)
    assert sched.kv.pool.num_free_blocks < 64
    sched.finish_request("a", RequestStatus.FINISHED_ABORTED)
    assert sched.kv.pool.num_free_blocks == 64
    assert req.status.finish_reason == "abort"
    assert sched.finish_request("a", RequestStatus.FINISHED_ABORTED) is None


def test_stop_conditions() -> None:
    sched = make_sched()
    eos = fake_next([3, 3, 3])
    r1 = Request("eos", [3, 3, 3], SamplingParams(max_tokens=10), frozenset({eos}))
    r2 = Request("ign", [3, 3, 3], SamplingParams(max_tokens=4, ignore_eos=True), frozenset({eos}))
    r3 = Request("stopid", [3, 3, 3], SamplingParams(max_tokens=10, stop_token_ids=[eos]))
    r4 = Request("min", [3, 3, 3], SamplingParams(max_tokens=3, min_tokens=2), frozenset({eos}))
    for r in (r1, r2, r3, r4):
        sched.add_request(r)
    while sched.has_unfinished():
        fake_step(sched)
    assert (r1.status.finish_reason, r1.num_output_tokens) == ("stop", 1)
    assert (r2.status.finish_reason, r2.num_output_tokens) == ("length", 4)
    assert (r3.status.finish_reason, r3.num_output_tokens) == ("stop", 1)
    assert r4.num_output_tokens >= 2


def test_max_model_len_caps_generation_and_rejects_long_prompts() -> None:
    sched = make_sched(max_model_len=10)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add_request(Request("long", list(range(1, 11)), SamplingParams()))
    req = Request("r", list(range(1, 8)), SamplingParams(max_tokens=50, ignore_eos=True))
    sched.add_request(req)
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(Request("r", [1], SamplingParams()))
    while sched.has_unfinished():
        fake_step(sched)
    assert req.num_tokens == 10 and req.status.finish_reason == "length"


class OneAdapterAtATime:
    """A test policy: at most one running request per adapter_key, hooks counted."""

    def __init__(self) -> None:
        self.active: dict[str | None, int] = {}
        self.admitted = 0
        self.released = 0
        self.steps: list[int] = []

    def begin_step(self, step: int, waiting) -> None:
        self.steps.append(step)

    def can_admit(self, request: Request) -> bool:
        return request.adapter_key is None or not self.active.get(request.adapter_key)

    def on_admitted(self, request: Request) -> None:
        self.active[request.adapter_key] = self.active.get(request.adapter_key, 0) + 1
        self.admitted += 1

    def on_released(self, request: Request) -> None:
        self.active[request.adapter_key] -= 1
        self.released += 1


def test_admission_policy_gates_and_hooks_balance() -> None:
    policy = OneAdapterAtATime()
    sched = make_sched(policy=policy, num_blocks=12)
    reqs = [
        Request(
            f"r{i}", [i + 1] * 9, SamplingParams(max_tokens=6, ignore_eos=True), adapter_key=key
        )
        for i, key in enumerate(["A", "A", None, "B", "A"])
    ]
    for r in reqs:
        sched.add_request(r)
    out, _ = fake_step(sched)
    first = [s.request.request_id for s in out.scheduled]
    assert first[:2] == ["r0", "r2"] and "r1" not in first  # r1 waits for adapter A
    sched.finish_request("r3", RequestStatus.FINISHED_ABORTED)
    while sched.has_unfinished():
        fake_step(sched)
        assert all(v <= 1 for k, v in policy.active.items() if k is not None)
    assert policy.admitted == policy.released
    assert all(v == 0 for v in policy.active.values())
    # The scheduler's own step clock: counts the steps that ran a batch, told to the policy.
    assert policy.steps == sorted(policy.steps) and sched.num_steps > 1
    assert set(range(sched.num_steps)) <= set(policy.steps) <= set(range(sched.num_steps + 1))

"""KV safety of speculation, without a model: 10,000 verifications with random acceptance
(n-gram drafts against each request's predetermined output, perturbed at random) under a pool
small enough that the scheduler preempts again and again, with prefix-cache hits. After every
step: no leaked or doubly held block, each running request holds exactly the blocks of its
computed tokens, every computed position's KV holds the right token, every cached block holds
the tokens its hash names; and each request's block table (each block's computed content)
equals the one a replay without speculation has at the same progress."""

from __future__ import annotations

import random

from loraplex.platform.engine.block_pool import BlockPool
from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request, RequestStatus
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.scheduler import Scheduler
from loraplex.platform.engine.speculative import SpecConfig
from loraplex.platform.engine.speculative.speculator import Speculator

BS = 4
NUM_BLOCKS = 48
VERIFICATIONS = 10_000


def workload(seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, the output the target 'samples') pairs: loops with random breaks, so drafts
    are sometimes right and sometimes wrong; shared prompt heads give prefix-cache hits."""
    rng = random.Random(seed)
    heads = [[rng.randrange(3, 60) for _ in range(8)] for _ in range(4)]
    out = []
    for _ in range(3000):
        loop = [rng.randrange(3, 60) for _ in range(rng.randrange(2, 6))]
        prompt = rng.choice(heads) + loop * rng.randrange(1, 4)
        truth = [t if rng.random() > 0.15 else rng.randrange(3, 60) for t in loop * 40]
        out.append((prompt, truth[: rng.randrange(5, 60)]))
    return out


class Sim:
    """A scheduler, KV manager and (optionally) speculator driven by a fake forward that
    writes each position's token into a slot -> token KV store."""

    def __init__(self, spec: bool) -> None:
        self.pool = BlockPool(NUM_BLOCKS)
        self.kv = KVCacheManager(self.pool, BS, "m")
        self.sched = Scheduler(
            self.kv, max_num_seqs=6, max_num_batched_tokens=40, max_model_len=200
        )
        cfg = SpecConfig(k_max=5, adaptive=False, adapter_tables=False)
        self.spec = Speculator(cfg, self.kv, 40, 200) if spec else None
        self.store: dict[int, int] = {}
        self.truth: dict[str, list[int]] = {}
        self.tables: dict[tuple[str, int, int], tuple] = {}
        self.hashed: dict[bytes, list[int]] = {}  # content hash -> the tokens it names
        self.verifications = 0
        self.rng = random.Random(7)

    def add(self, rid: str, prompt: list[int], truth: list[int]) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=len(truth), ignore_eos=True)
        self.sched.add_request(Request(rid, prompt, params))
        self.truth[rid] = truth
        full = Request(rid, prompt, params, output_token_ids=truth)
        toks = prompt + truth
        for i, h in enumerate(self.kv.block_hashes(full)):
            self.hashed[h] = toks[i * BS : (i + 1) * BS]

    def step(self) -> None:
        out = self.sched.schedule()
        if self.spec is not None:
            self.spec.plan(out)
        for s in out.scheduled:
            r = s.request
            toks = r.token_slice(s.start, s.start + s.num_tokens) + r.spec_token_ids
            for i, tok in enumerate(toks):
                p = s.start + i
                self.store[r.block_ids[p // BS] * BS + p % BS] = tok
        sampled: dict[str, int | None] = {}
        accepted: dict[str, list[int]] = {}
        for s in out.scheduled:
            r = s.request
            if not s.samples:
                continue
            truth = self.truth[r.request_id][r.num_output_tokens :]
            drafts = r.spec_token_ids
            a = 0
            while a < len(drafts) and a + 1 < len(truth) and drafts[a] == truth[a]:
                a += 1
            sampled[r.request_id] = truth[0]
            if a:
                accepted[r.request_id] = truth[1 : a + 1]
            self.verifications += 1 if drafts else 0
        self.sched.update(out, sampled, accepted)
        if self.spec is not None:
            emitted = {k: [v, *accepted.get(k, [])] for k, v in sampled.items() if v is not None}
            self.spec.settle(out, emitted)
        self.check()

    def table(self, r: Request) -> tuple[tuple[int | None, ...], ...]:
        """The request's block table as content: per block, the KV store's tokens at its
        computed positions."""
        nc = r.num_computed_tokens
        return tuple(
            tuple(self.store.get(b * BS + i) for i in range(BS) if j * BS + i < nc)
            for j, b in enumerate(r.block_ids)
        )

    def check(self) -> None:
        held: dict[int, int] = {}
        for r in self.sched.requests.values():
            for b in r.block_ids:
                held[b] = held.get(b, 0) + 1
            if r.status == RequestStatus.RUNNING:
                assert len(r.block_ids) == -(-r.num_computed_tokens // BS), r.request_id
                key = (r.request_id, r.num_computed_tokens, r.num_tokens)
                self.tables[key] = self.table(r)
                all_toks = r.all_token_ids
                for p in range(r.num_computed_tokens):
                    slot = r.block_ids[p // BS] * BS + p % BS
                    assert self.store[slot] == all_toks[p], (r.request_id, p)
            else:
                assert not r.block_ids
        for block in self.pool.blocks:
            assert block.ref_cnt == held.get(block.block_id, 0), block.block_id
        assert self.pool.num_free_blocks == NUM_BLOCKS - len(held)
        # every cached block holds the tokens of some live-or-past request's hashed prefix
        for block in self.pool.blocks:
            if block.block_hash is not None:
                want = self.hashed[block.block_hash]
                got = [self.store.get(block.block_id * BS + i) for i in range(BS)]
                assert got == want, block.block_id


def run(spec: bool, stop_after: int | None) -> Sim:
    sim = Sim(spec)
    jobs = workload(11)
    nxt = 0
    steps = 0
    while True:
        while len(sim.sched.requests) < 10 and nxt < len(jobs):
            rid = f"r{nxt}"
            sim.add(rid, *jobs[nxt])
            nxt += 1
        if not sim.sched.has_unfinished():
            break
        sim.step()
        steps += 1
        if stop_after is not None and nxt >= stop_after and not sim.sched.has_unfinished():
            break
        if spec and sim.verifications >= VERIFICATIONS and stop_after is None:
            sim.stop_at = nxt
            break
    return sim


def test_ten_thousand_random_verifications_leak_nothing_and_match_a_replay():
    spec = run(True, None)
    assert spec.verifications >= VERIFICATIONS
    assert spec.sched.num_preemptions > 50, spec.sched.num_preemptions
    assert spec.kv.hits > 0
    st = spec.spec.stats[None]
    assert 0.2 * st.drafted < st.accepted < 0.9 * st.drafted  # both accepts and rejects
    for rid in list(spec.sched.requests):  # drain: everything goes back to the pool
        spec.sched.finish_request(rid, RequestStatus.FINISHED_ABORTED)
    assert spec.pool.num_free_blocks == NUM_BLOCKS
    replay = run(False, spec.stop_at)
    common = spec.tables.keys() & replay.tables.keys()
    assert len(common) > 0.5 * len(spec.tables)
    for key in common:
        assert spec.tables[key] == replay.tables[key], key

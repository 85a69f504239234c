"""Speculation through the whole engine: greedy and seeded outputs token-identical with it on
and off (500 prompts, mixed adapters and base rows in one batch, drafts really accepted),
logprobs unchanged, penalties and stop conditions honoured, no KV block leaked."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.speculative import SpecConfig  # noqa: E402

FORCED = SpecConfig(k_max=4, adaptive=False)  # always draft: the tests must exercise it


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    base = tmp_path_factory.mktemp("base")
    hf = save_tiny_model(base, "llama", seed=11)
    adapters = [
        str(make_adapter(hf, tmp_path_factory.mktemp(f"a{i}"), seed=40 + i, **kw))
        for i, kw in enumerate(
            [
                dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                dict(r=8, lora_alpha=16, target_modules="all-linear"),
                dict(r=8, lora_alpha=8, target_modules=["o_proj", "down_proj"]),
            ]
        )
    ]
    return str(base), adapters


def make_llm(base: str, **kw: object) -> LLM:
    args = dict(
        block_size=4, max_num_batched_tokens=512, max_num_seqs=64, max_loras=4, max_lora_rank=8
    )
    args.update(kw)
    return LLM(base, **args)


def copy_prompts(n: int, seed: int = 3) -> list[list[int]]:
    """Prompts that repeat a random phrase (so prompt lookup finds matches) or are random."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        phrase = torch.randint(3, 128, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
        body = phrase.tolist() * int(torch.randint(1, 5, (1,), generator=g))
        if i % 5 == 4:
            body = torch.randint(3, 128, (len(body),), generator=g).tolist()
        out.append(body)
    return out


def run(llm: LLM, prompts, params, adapters, spec: SpecConfig | None):
    llm.core.enable_speculation(spec)
    outs = llm.generate(prompts, params, adapters=adapters)
    assert llm.core.pool.num_free_blocks == llm.core.pool.num_blocks  # nothing leaked
    return outs


def test_greedy_is_token_identical_with_speculation_500_prompts_mixed_adapters(world):
    base, adapters = world
    llm = make_llm(base)
    prompts = copy_prompts(500)
    refs = [([None] + adapters)[i % 4] for i in range(500)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    off = run(llm, prompts, params, refs, None)
    on = run(llm, prompts, params, refs, FORCED)
    stats = llm.core.speculator.stats
    assert {None, *[k for k in stats if k is not None]} == set(stats) and len(stats) == 4
    accepted = sum(s.accepted for s in stats.values())
    assert accepted > 1000, f"too few drafts accepted ({accepted}) for the test to mean much"
    for i, (a, b) in enumerate(zip(off, on, strict=True)):
        assert a.token_ids == b.token_ids, f"prompt {i} (adapter {refs[i]})"
        assert a.finish_reason == b.finish_reason


def test_seeded_sampling_penalties_and_logprobs_are_identical_with_speculation(world):
    base, adapters = world
    llm = make_llm(base)
    prompts = copy_prompts(48, seed=9)
    refs = [([None] + adapters)[i % 4] for i in range(48)]
    params = [
        SamplingParams(
            temperature=[0.3, 1.0, 1.5][i % 3],
            top_p=[1.0, 0.8][i % 2],
            top_k=[0, 20][i % 2],
            frequency_penalty=0.5 if i % 4 == 1 else 0.0,
            repetition_penalty=1.3 if i % 4 == 2 else 1.0,
            logit_bias={5: 3.0} if i % 4 == 3 else None,
            min_tokens=4,
            seed=1000 + i,
            logprobs=2,
            max_tokens=20,
        )
        for i in range(48)
    ]
    off = run(llm, prompts, params, refs, None)
    on = run(llm, prompts, params, refs, SpecConfig(k_max=5, adaptive=False))
    assert sum(s.accepted for s in llm.core.speculator.stats.values()) >= 8
    for a, b in zip(off, on, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert len(b.logprobs) == len(b.token_ids)
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            assert la.keys() == lb.keys()
            for t in la:
                assert la[t] == pytest.approx(lb[t], abs=1e-4)


def test_stop_token_inside_accepted_drafts_ends_the_request_there(world):
    base, _ = world
    llm = make_llm(base, max_loras=0, max_lora_rank=0)
    prompt = [7, 8, 9, 10] * 6
    free = run(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=30), None, None)[0]
    stop = free.token_ids[5]
    params = SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stop])
    off = run(llm, [prompt], params, None, None)[0]
    on = run(llm, [prompt], params, None, FORCED)[0]
    assert on.token_ids == off.token_ids and on.token_ids[-1] == stop
    assert on.finish_reason == "stop"
    short = SamplingParams(temperature=0.0, max_tokens=3)
    assert run(llm, [prompt], short, None, FORCED)[0].token_ids == free.token_ids[:3]


def test_an_adapters_past_outputs_draft_for_its_next_requests_only(world):
    base, adapters = world
    llm = make_llm(base)
    prompt = torch.randperm(120, generator=torch.Generator().manual_seed(2))[:30].add(3).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    a, b = adapters[0], adapters[1]
    want = run(llm, [prompt], params, [a], None)[0].token_ids
    llm.core.enable_speculation(FORCED)
    first = run(llm, [prompt], params, [a], FORCED)[0]
    spec = llm.core.speculator
    key_a = next(k for k in spec.stats if k is not None)
    before = spec.stats[key_a].accepted
    again = llm.generate([prompt], params, adapters=[a])[0]  # same speculator, same tables
    other = llm.generate([prompt], params, adapters=[b])[0]
    assert first.token_ids == again.token_ids == want
    from_table = spec.stats[key_a].accepted - before
    key_b = next(k for k in spec.stats if k not in (None, key_a))
    # the second request drafted from the first's output (at most 24 - 3 tokens can be:
    # drafting starts once two output tokens match the table, and the last is always sampled)
    assert from_table >= 12, from_table
    assert spec.stats[key_b].accepted < from_table / 2  # adapter b has no table of a's output
    assert other.token_ids != want

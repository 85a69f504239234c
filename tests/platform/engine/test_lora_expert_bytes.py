"""Expert-LoRA bytes count in adapter admission: a replica whose expert-factor budget holds one
adapter's experts runs adapters with expert LoRA one at a time (evicting the idle one's factors
to make room), every request still finishes, and an adapter whose expert factors alone exceed
the budget has its requests finished instead of left waiting."""

from __future__ import annotations

import time

import pytest

from loraplex.platform.engine import LLM, SamplingParams
from loraplex.platform.engine.lora.runtime import LoraRuntime

pytest.importorskip("peft")

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from support.expert_adapters import expert_adapter, moe_base

    hf = moe_base("qwen3_moe")
    base = tmp_path_factory.mktemp("base")
    hf.save_pretrained(str(base))
    dirs = [expert_adapter(hf, tmp_path_factory.mktemp(f"ad{i}"), seed=20 + i) for i in range(3)]
    return str(base), [str(d) for d in dirs]


def _engine(base: str, expert_bytes: int | None):
    llm = LLM(base, dtype="float32", block_size=4, max_num_batched_tokens=64, max_num_seqs=8)
    core = llm.core
    runtime = LoraRuntime.for_engine(
        core, max_loras=3, max_lora_rank=8, expert_lora_memory_bytes=expert_bytes
    )
    core.install_lora_runtime(runtime)
    return core, runtime


def _run(core, runtime, requests):
    """Step to the end; per step the adapters scheduled and the expert bytes held."""
    seen, held, finished = [], [], {}
    prepare = runtime.prepare_step

    def spy(reqs, num_tokens):
        seen.append({r.adapter_key for r in reqs if r.adapter_key is not None})
        return prepare(reqs, num_tokens)

    runtime.prepare_step = spy
    params = SamplingParams(max_tokens=3, **GREEDY)
    for rid, adapter in requests:
        core.add_request([5, 6, 7, 8], params, rid, adapter=adapter)
    deadline = time.monotonic() + 60
    while core.has_unfinished() and time.monotonic() < deadline:
        for d in core.step():
            if d.finished:
                finished[d.request_id] = d.finish_reason
        held.append(runtime.experts.nbytes)
        time.sleep(0.001)
    return seen, held, finished


def test_expert_bytes_bound_how_many_adapters_run(world):
    base, dirs = world
    core, runtime = _engine(base, None)  # the default budget: max_loras adapters of max rank
    seen, _, finished = _run(core, runtime, [(f"r{i}", d) for i, d in enumerate(dirs)])
    assert max(len(s) for s in seen) == 3  # all three at once when the budget allows
    one = runtime.experts.nbytes_of(runtime.experts.held_keys()[0])
    assert one > 0 and runtime.experts.nbytes == 3 * one

    core, runtime = _engine(base, one + one // 2)  # room for one adapter's expert factors
    seen, held, finished = _run(core, runtime, [(f"r{i}", d) for i, d in enumerate(dirs)])
    assert finished == {"r0": "length", "r1": "length", "r2": "length"}
    assert max(len(s) for s in seen) == 1  # the slots allow 3; the expert bytes allow 1
    assert max(held) <= one + one // 2
    assert len(runtime.resident_adapters) == 1  # the idle ones were evicted to make room


def test_adapter_larger_than_the_expert_budget_is_finished(world):
    base, dirs = world
    core, runtime = _engine(base, 1024)  # less than any adapter's expert factors
    _, _, finished = _run(core, runtime, [("big", dirs[0]), ("plain", None)])
    assert finished == {"big": "abort", "plain": "length"}

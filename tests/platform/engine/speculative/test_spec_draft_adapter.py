"""Draft adapters (`method="draft_adapter"`, issue 25): a LoRA for the draft model tied to a
target adapter version drafts that adapter's requests. With the draft model a copy of the
target and the draft adapter a copy of the target adapter, every greedy draft of the adapter's
rows is accepted; without one, they fall back to the adapter's suffix tables, else the plain
draft (accepting few). Greedy output is token-identical to decoding without speculation."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.peft_adapters import make_adapter  # noqa: E402
from test_spec_engine import copy_prompts  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.speculative import SpecConfig  # noqa: E402

ARGS = dict(block_size=4, max_num_batched_tokens=512, max_num_seqs=32, max_loras=2,
            max_lora_rank=8)  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("base")
    hf = save_tiny_model(base, "llama", seed=11)
    draft = tmp_path_factory.mktemp("draft")
    save_tiny_model(draft, "llama", seed=11)
    adapter = make_adapter(hf, tmp_path_factory.mktemp("a"), seed=41, r=4, lora_alpha=8,
                           target_modules=["q_proj", "v_proj"])  # fmt: skip
    draft_adapter = tmp_path_factory.mktemp("da") / "copy"
    shutil.copytree(adapter, draft_adapter)
    return str(base), str(draft), str(adapter), str(draft_adapter)


def _run(world, register: bool):
    base, draft, adapter, draft_adapter = world
    prompts = copy_prompts(40, seed=21)
    refs = [(None, adapter)[i % 2] for i in range(40)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    plain = LLM(base, **ARGS).generate(prompts, params, adapters=refs)
    llm = LLM(base, **ARGS)
    core = llm.core
    core.enable_speculation(
        SpecConfig(method="draft_adapter", draft_model=draft, k_max=4, adaptive=False)
    )
    spec = core.speculator
    assert spec is not None and core.lora_runtime is not None
    target_key, _ = core.lora_runtime.resolve_adapter(adapter)
    if register:
        spec.register_draft_adapter(target_key, draft_adapter)
    on = llm.generate(prompts, params, adapters=refs)
    for a, b in zip(plain, on, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert core.pool.num_free_blocks == core.pool.num_blocks
    assert spec.drafter is not None and spec.drafter.num_free_blocks == spec.drafter.num_blocks
    return spec.stats, target_key


def test_a_registered_draft_adapter_drafts_its_target_adapters_requests(world) -> None:
    stats, key = _run(world, register=True)
    assert stats[key].drafted > 200 and stats[key].accepted == stats[key].drafted
    assert stats[None].accepted == stats[None].drafted  # the plain draft is the target's copy


def test_without_a_draft_adapter_the_adapter_falls_back(world) -> None:
    stats, key = _run(world, register=False)
    assert stats[key].drafted > 100 and stats[key].accepted < 0.5 * stats[key].drafted


def test_draft_adapters_need_the_draft_adapter_method(world) -> None:
    base, draft, adapter, draft_adapter = world
    llm = LLM(base, **ARGS)
    llm.core.enable_speculation(SpecConfig(method="draft_model", draft_model=draft, k_max=2))
    with pytest.raises(ValueError, match="need speculative method 'draft_adapter'"):
        llm.core.speculator.register_draft_adapter("k", draft_adapter)


def test_draft_adapters_beyond_the_draft_slots_take_turns(world, tmp_path) -> None:
    """With more tied draft adapters than the draft model's slots, a tie whose target has no
    running request gives its slot up (least recently used first): each adapter in turn
    drafts with its own draft adapter, none falls back to the plain draft for good."""
    from transformers import AutoModelForCausalLM

    base, draft, _, _ = world
    hf = AutoModelForCausalLM.from_pretrained(base)
    targets = []
    for seed in (51, 52, 53):  # three targets of rank 8, each with its draft copy: rows for two
        adapter = make_adapter(hf, tmp_path / f"t{seed}", seed=seed, r=8, lora_alpha=16,
                               target_modules=["q_proj", "v_proj"])  # fmt: skip
        copy = tmp_path / f"d{seed}"
        shutil.copytree(adapter, copy)
        targets.append((str(adapter), str(copy)))
    llm = LLM(base, **ARGS)
    core = llm.core
    core.enable_speculation(
        SpecConfig(method="draft_adapter", draft_model=draft, k_max=4, adaptive=False)
    )
    spec = core.speculator
    assert spec is not None and core.lora_runtime is not None
    keys = []
    for adapter, copy in targets:
        key, _ = core.lora_runtime.resolve_adapter(adapter)
        spec.register_draft_adapter(key, copy)
        keys.append(key)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for _round in range(2):  # A, B, C, then A again: each needs a slot another one held
        for (adapter, _), key in zip(targets, keys, strict=True):
            before = spec.stats[key].drafted if key in spec.stats else 0
            llm.generate(copy_prompts(6, seed=22), params, adapters=[adapter] * 6)
            st = spec.stats[key]
            assert st.drafted - before > 30
            assert st.accepted == st.drafted, f"adapter {keys.index(key)} drafted without its own"
    assert spec.drafter is not None and spec.drafter.num_free_blocks == spec.drafter.num_blocks


def test_a_draft_model_is_guarded_at_every_batch_size(world) -> None:
    base, draft, _, _ = world
    with_draft = LLM(base, **ARGS).core
    with_draft.enable_speculation(SpecConfig(method="draft_model", draft_model=draft, k_max=2))
    lookup = LLM(base, **ARGS).core
    lookup.enable_speculation(SpecConfig())
    assert with_draft.speculator.guard.min_batch == 1
    assert lookup.speculator.guard.min_batch > 1  # prompt lookup costs next to nothing

"""The draft model (`method="draft_model"`, issue 25): its drafts and their distributions q
match transformers on the same checkpoint as its own KV cache catches up over accepted and
rejected drafts; through the whole engine greedy output is token-identical with it on and off
(mixed adapters, drafts really accepted), no block of either cache leaks, and a draft model
with another vocabulary is refused."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.peft_adapters import make_adapter  # noqa: E402
from test_spec_engine import copy_prompts  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.request import Request  # noqa: E402
from loraplex.platform.engine.sampler import Sampler  # noqa: E402
from loraplex.platform.engine.speculative import SpecConfig  # noqa: E402
from loraplex.platform.engine.speculative.draft_model import DraftModel  # noqa: E402
from loraplex.platform.engine_spec.speculative import SpeculativeOption  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("base")
    hf = save_tiny_model(base, "llama", seed=11)
    same = tmp_path_factory.mktemp("same")  # the target's own weights: drafts mostly accepted
    save_tiny_model(same, "llama", seed=11)
    other = tmp_path_factory.mktemp("other")
    other_hf = save_tiny_model(other, "llama", seed=12)
    adapter = make_adapter(hf, tmp_path_factory.mktemp("a"), seed=41, r=4, lora_alpha=8,
                           target_modules=["q_proj", "v_proj"])  # fmt: skip
    return str(base), str(same), str(other), other_hf.eval(), str(adapter)


def _greedy(hf, tokens: list[int], n: int) -> list[int]:
    out = list(tokens)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(hf(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(tokens) :]


def test_drafts_and_q_match_transformers_across_catch_up(world) -> None:
    _, _, other, other_hf, _ = world
    vocab = other_hf.config.vocab_size
    draft = DraftModel.load(other, vocab, block_size=4, max_model_len=128, dtype="float32",
                            device="cpu")  # fmt: skip
    free = draft.num_free_blocks
    prompt = [5, 17, 33, 9, 41, 7, 3]
    r = Request("r", prompt, SamplingParams(temperature=0.0))
    (d,) = draft.propose([r], [4], Sampler())
    assert list(d) == _greedy(other_hf, prompt, 4)
    # the target accepted two drafts and then sampled its own token: the cache drops the rest
    r.output_token_ids = list(d[:2]) + [60]
    (d2,) = draft.propose([r], [3], Sampler())
    assert list(d2) == _greedy(other_hf, prompt + r.output_token_ids, 3)
    # sampled drafts carry q: the draft's distribution after the request's settings
    hot = Request("h", prompt, SamplingParams(temperature=0.7))
    (d3,) = draft.propose([hot], [2], Sampler())
    with torch.no_grad():
        logits = other_hf(torch.tensor([prompt + [d3[0]]])).logits[0, -2:].float()
    assert torch.allclose(d3.probs, torch.softmax(logits / 0.7, -1), atol=1e-5)
    for rid in ("r", "h"):
        draft.release(rid)
    assert draft.num_free_blocks == free


def test_a_draft_model_with_another_vocabulary_is_refused(world, tmp_path) -> None:
    save_tiny_model(tmp_path, "llama", seed=3, with_tokenizer=False, vocab_size=64)
    with pytest.raises(ValueError, match="must share the target's tokenizer"):
        DraftModel.load(str(tmp_path), 128, block_size=4, max_model_len=64, dtype="float32",
                        device="cpu")  # fmt: skip


@pytest.mark.parametrize("which", ["same", "other"])
def test_greedy_is_token_identical_with_a_draft_model(world, which: str) -> None:
    base, same, other, _, adapter = world
    option = SpeculativeOption("draft_model", 0, 4, same if which == "same" else other)
    args = dict(block_size=4, max_num_batched_tokens=512, max_num_seqs=32, max_loras=2,
                max_lora_rank=8)  # fmt: skip
    prompts = copy_prompts(60, seed=9)
    refs = [(None, adapter)[i % 2] for i in range(60)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    plain = LLM(base, **args).generate(prompts, params, adapters=refs)
    llm = LLM(base, speculative=option.to_json(), **args)
    assert llm.core.speculator is not None and llm.core.speculator.drafter is not None
    forced = SpecConfig(
        method="draft_model", draft_model=option.draft_model, k_max=4, adaptive=False
    )  # always draft: the test must exercise it; fmt: skip
    llm.core.enable_speculation(forced)
    spec = llm.core.speculator
    assert spec is not None and spec.drafter is not None
    on = llm.generate(prompts, params, adapters=refs)
    for a, b in zip(plain, on, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    drafted = sum(s.drafted for s in spec.stats.values())
    accepted = sum(s.accepted for s in spec.stats.values())
    assert drafted > 500
    if which == "same":  # the base rows draft with the target's own weights: all accepted
        assert spec.stats[None].accepted == spec.stats[None].drafted > 100
    else:
        assert 0 < accepted < drafted
    assert llm.core.pool.num_free_blocks == llm.core.pool.num_blocks
    assert spec.drafter.num_free_blocks == spec.drafter.num_blocks

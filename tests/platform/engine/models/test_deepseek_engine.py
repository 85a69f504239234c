"""DeepSeek-V2 and V3 through the whole engine (scheduler, chunked prefill under a small token
budget, prefix caching): greedy tokens equal transformers' generate, and every sampled token's
logprobs equal transformers' within 1e-5 in fp32, with cached prefixes counted."""

from __future__ import annotations

import pytest
import torch

from loraplex.bench._synthetic.models import save_char_tokenizer
from loraplex.platform.engine import LLM, SamplingParams

pytest.importorskip("transformers")

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("case", ["v2_lite_greedy", "v3_yarn_interleaved"])
def test_deepseek_engine_equals_transformers(tmp_path, case):
    from test_deepseek_models import save_deepseek

    hf = save_deepseek(tmp_path, case)
    save_char_tokenizer(tmp_path, 128)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    llm = LLM(str(tmp_path), dtype="float32", block_size=4, max_num_batched_tokens=16,
              max_num_seqs=8)  # fmt: skip
    shared = list(range(3, 30))  # 27 tokens: prefilled in chunks of at most 16
    prompts = [shared + [40, 41], shared + [50], [7, 8, 9]]
    params = SamplingParams(max_tokens=6, logprobs=3, **GREEDY)
    llm.generate(prompts[:1], params)  # warm the prefix cache
    outs = llm.generate(prompts, params)
    assert outs[1].num_cached_tokens >= 24
    for prompt, out in zip(prompts, outs, strict=True):
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
        assert out.token_ids == want[0, len(prompt) :].tolist()
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompt + out.token_ids])).logits[0], -1)
        for j, lp in enumerate(out.logprobs):
            row = ref[len(prompt) - 1 + j]
            assert set(row.topk(3).indices.tolist()) <= set(lp)
            for tok, value in lp.items():
                assert value == pytest.approx(row[tok].item(), abs=1e-5)


def test_deepseek_engine_runs_in_bf16(tmp_path):
    """The bf16 engine (the `auto` choice on CPUs with native bf16: packed oneDNN weights)
    follows transformers' fp32 distribution to bf16 precision."""
    from test_deepseek_models import save_deepseek

    hf = save_deepseek(tmp_path, "v3_yarn_interleaved")
    save_char_tokenizer(tmp_path, 128)
    llm = LLM(str(tmp_path), dtype="bfloat16", block_size=4, max_num_batched_tokens=16,
              max_num_seqs=8)  # fmt: skip
    prompt = list(range(3, 30))
    out = llm.generate([prompt], SamplingParams(max_tokens=4, logprobs=1, **GREEDY))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt + out.token_ids])).logits[0], -1)
    for j, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        assert lp[tok] == pytest.approx(ref[len(prompt) - 1 + j, tok].item(), abs=0.15)

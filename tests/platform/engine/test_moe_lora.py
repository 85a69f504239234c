"""Attention-projection LoRA adapters over MoE base models: the engine (multi-LoRA runtime,
mixed adapters and base requests in one batch) equals peft over transformers' MoE model."""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.logit_spy import record_sampled_logits
from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import hf_config, random_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

ADAPTERS = {
    "qkvo_r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "qv_r4_rslora": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"]),
}


def _base(arch: str):
    if arch == "mixtral":
        cfg = hf_config("mixtral", intermediate_size=80, num_local_experts=4, num_experts_per_tok=2)
    else:
        cfg = hf_config(
            "qwen3_moe", intermediate_size=80, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, norm_topk_prob=True,
        )  # fmt: skip
    hf = random_model(cfg, seed=4)
    hf.generation_config.eos_token_id = None
    return hf


def _peft_logits(hf, adapter_dir, tokens: list[int]) -> torch.Tensor:
    from peft import PeftModel

    model = copy.deepcopy(hf)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_attention_lora_over_moe_matches_peft(tmp_path, arch):
    hf = _base(arch)
    hf.save_pretrained(str(tmp_path / "base"))
    dirs = {
        name: make_adapter(hf, tmp_path / name, seed=10 + i, **kw)
        for i, (name, kw) in enumerate(ADAPTERS.items())
    }
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (11, 5, 17)]
    refs = [dirs["qkvo_r8"], None, dirs["qv_r4_rslora"]]
    for ref in (r for r in refs if r is not None):  # the adapters really change the output
        delta = _peft_logits(hf, ref, prompts[0]) - _peft_logits(hf, None, prompts[0])
        assert delta.abs().max() > 1e-2
    llm = LLM(str(tmp_path / "base"), max_loras=2, block_size=4, max_num_batched_tokens=16,
              max_num_seqs=4)  # fmt: skip
    rows = record_sampled_logits(llm)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, adapters=[str(r) if r else None for r in refs])
    by_prompt = {int(rid.split("-")[-2]): torch.stack(rs) for rid, rs in rows.items()}
    for i, (prompt, ref, out) in enumerate(zip(prompts, refs, outs, strict=True)):
        seq = prompt + out.outputs[0].token_ids
        want = _peft_logits(hf, ref, seq[:-1])[len(prompt) - 1 :]
        torch.testing.assert_close(by_prompt[i], want, atol=1e-4, rtol=0)

"""Expert, router and attention LoRA served by the expert-parallel engine (2 gloo ranks): the
follower holds the adapters rank 0 runs, and mixed adapter / base requests equal peft over
transformers (fp32 logprobs within 1e-5, greedy equal) before and after an EPLB rebalance."""

from __future__ import annotations

import copy
import os
import types

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("peft")


def _peft_logprobs(hf, adapter_dir, tokens: list[int]) -> torch.Tensor:
    from peft import PeftModel

    model = copy.deepcopy(hf)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)


def test_expert_lora_on_the_ep2_engine_matches_peft_across_a_rebalance(tmp_path):
    from support.expert_adapters import expert_adapter, moe_base
    from support.logit_spy import record_sampled_logits

    from loraplex.platform.engine.ep_engine import start_ep_engine
    from loraplex.platform.engine.lora.runtime import LoraRuntime
    from loraplex.platform.engine.sampling_params import SamplingParams
    from loraplex.platform.engine_spec.config import EngineConfig

    hf = moe_base("qwen3_moe")
    hf.save_pretrained(str(tmp_path / "base"))
    fused = expert_adapter(hf, tmp_path / "fused", seed=11)
    other = expert_adapter(hf, tmp_path / "other", seed=12, r=2, lora_alpha=4,
                           params=["mlp.experts.down_proj", "mlp.gate.weight"],
                           target_modules=["v_proj"])  # fmt: skip
    config = EngineConfig(
        model=str(tmp_path / "base"), max_num_seqs=4, max_num_batched_tokens=16,
        max_model_len=64, block_size=4, num_gpu_blocks=64, max_loras=2, max_lora_rank=8,
    )  # fmt: skip
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (11, 5, 9)]
    refs = [fused, None, other]
    engine = start_ep_engine(config, 2, num_redundant=2, backend="gloo")
    try:
        engine.install_lora_runtime(LoraRuntime.for_engine(engine.core))
        rows = record_sampled_logits(types.SimpleNamespace(core=engine.core))
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        reqs = [
            engine.add_request(p, params, adapter=str(r) if r else None)
            for p, r in zip(prompts, refs, strict=True)
        ]
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
            if steps == 3:  # mid-generation: experts and their adapter slices move
                engine.rebalance()
        assert engine.last_rebalance
    finally:
        engine.close()
    for prompt, ref, req in zip(prompts, refs, reqs, strict=True):
        seq = prompt + list(req.output_token_ids)
        want = _peft_logprobs(hf, ref, seq[:-1])[len(prompt) - 1 :]
        got = torch.log_softmax(torch.stack(rows[req.request_id]), dim=-1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert list(req.output_token_ids) == want.argmax(-1).tolist()

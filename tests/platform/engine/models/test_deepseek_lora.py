"""LoRA over tiny DeepSeek-V2 and V3 bases: adapters on MLA's projections (q_a/q_b or q_proj,
kv_a_proj_with_mqa, o_proj), on the routed experts and on the router, mixed with the base in
one batch, give peft's fp32 logprobs within 1e-5 and its greedy tokens; a kv_b_proj target
(absorbed into the latent attention) is refused by name."""

from __future__ import annotations

import pytest
import torch
from support.peft_logprobs import peft_logprobs

from loraplex.platform.engine import LLM, SamplingParams

pytest.importorskip("peft")

EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"]


@pytest.mark.parametrize(
    ("case", "attention"),
    [
        ("v3_yarn_interleaved", ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"]),
        ("v2_lite_greedy", ["q_proj", "kv_a_proj_with_mqa", "o_proj"]),
    ],
)
def test_deepseek_lora_matches_peft(tmp_path, case, attention):
    from support.logit_spy import record_sampled_logits
    from support.peft_adapters import make_adapter
    from test_deepseek_models import save_deepseek

    hf = save_deepseek(tmp_path / "base", case)
    hf.generation_config.eos_token_id = None
    attn_only = make_adapter(hf, tmp_path / "attn", seed=11, r=4, lora_alpha=8,
                             target_modules=attention)  # fmt: skip
    experts = make_adapter(hf, tmp_path / "experts", seed=12, r=2, lora_alpha=4,
                           target_modules=["o_proj"], target_parameters=EXPERT_PARAMS)  # fmt: skip
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (11, 5, 17)]
    refs = [attn_only, None, experts]
    for ref in (attn_only, experts):
        delta = peft_logprobs(hf, ref, prompts[0]) - peft_logprobs(hf, None, prompts[0])
        assert delta.abs().max() > 1e-2  # each adapter really changes the output
    llm = LLM(str(tmp_path / "base"), dtype="float32", max_loras=2, block_size=4,
              max_num_batched_tokens=16, max_num_seqs=4, max_lora_rank=8)  # fmt: skip
    rows = record_sampled_logits(llm)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, adapters=[str(r) if r else None for r in refs])
    by_prompt = {int(rid.split("-")[-2]): torch.stack(rs) for rid, rs in rows.items()}
    for i, (prompt, ref, out) in enumerate(zip(prompts, refs, outs, strict=True)):
        seq = prompt + out.outputs[0].token_ids
        want = peft_logprobs(hf, ref, seq[:-1])[len(prompt) - 1 :]
        got = torch.log_softmax(by_prompt[i], dim=-1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert out.outputs[0].token_ids == want.argmax(-1).tolist()


def test_kv_b_proj_lora_is_refused_by_name(tmp_path):
    from support.peft_adapters import make_adapter
    from test_deepseek_models import save_deepseek

    hf = save_deepseek(tmp_path / "base", "v3_yarn_interleaved")
    bad = make_adapter(hf, tmp_path / "kvb", seed=1, r=2, lora_alpha=4,
                       target_modules=["kv_b_proj", "o_proj"])  # fmt: skip
    llm = LLM(str(tmp_path / "base"), dtype="float32", max_loras=1, block_size=4,
              max_lora_rank=8)  # fmt: skip
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    with pytest.raises(ValueError, match="kv_b_proj"):
        llm.generate([[5, 6, 7]], params, adapters=[str(bad)])


def test_deepseek_lora_on_the_ep2_engine_matches_peft(tmp_path):
    """The expert-parallel engine (2 gloo ranks, an EPLB rebalance mid-generation) serves an
    adapter on MLA's projections, the experts and the router over DeepSeek-V3 as peft does."""
    import types

    from support.logit_spy import record_sampled_logits
    from support.peft_adapters import make_adapter
    from test_deepseek_models import save_deepseek

    from loraplex.platform.engine.ep_engine import start_ep_engine
    from loraplex.platform.engine.lora.runtime import LoraRuntime
    from loraplex.platform.engine_spec.config import EngineConfig

    hf = save_deepseek(tmp_path / "base", "v3_yarn_interleaved")
    adapter = make_adapter(hf, tmp_path / "ad", seed=12, r=2, lora_alpha=4,
                           target_modules=["q_b_proj", "o_proj"],
                           target_parameters=EXPERT_PARAMS)  # fmt: skip
    config = EngineConfig(
        model=str(tmp_path / "base"), dtype="float32", max_num_seqs=4,
        max_num_batched_tokens=16, max_model_len=64, block_size=4, num_gpu_blocks=64,
        max_loras=2, max_lora_rank=8,
    )  # fmt: skip
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (11, 5)]
    refs = [adapter, None]
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
            if steps == 3:
                engine.rebalance()
        assert engine.last_rebalance
    finally:
        engine.close()
    for prompt, ref, req in zip(prompts, refs, reqs, strict=True):
        seq = prompt + list(req.output_token_ids)
        want = peft_logprobs(hf, ref, seq[:-1])[len(prompt) - 1 :]
        got = torch.log_softmax(torch.stack(rows[req.request_id]), dim=-1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert list(req.output_token_ids) == want.argmax(-1).tolist()

"""LoRA on the experts and the router inside the grouped expert path: the kernel against a
merged-weight reference, and the engine (mixed adapters and base requests in one batch)
against peft over transformers' own MoE models (fp32 logprobs within 1e-5, greedy equal)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

from loraplex.moe.expert_lora import (
    ExpertLoraBatch,
    ExpertLoraWeights,
    add_router_lora,
    fused_experts_lora_torch,
)
from loraplex.moe.gating import softmax_topk

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _random_lora(g, experts, hidden, inter, rank, router=True) -> ExpertLoraWeights:
    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    return ExpertLoraWeights(
        w13_a=r(experts, rank, hidden), w13_b=r(experts, 2 * inter, rank),
        w2_a=r(experts, rank + 1, inter), w2_b=r(experts, hidden, rank + 1),
        router_a=r(rank, hidden) if router else None, router_b=r(experts, rank) if router else None,
    )  # fmt: skip


def _merged_reference(x, w13, w2, weights, ids, token_slot, slots):
    """Each token through its adapter's merged experts W_e + B_e A_e, one token at a time."""
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        lora = slots[token_slot[t]] if token_slot[t] >= 0 else None
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            m13, m2 = w13[e], w2[e]
            if lora is not None:
                m13 = m13 + lora.w13_b[e] @ lora.w13_a[e]
                m2 = m2 + lora.w2_b[e] @ lora.w2_a[e]
            gu = m13 @ x[t]
            out[t] += weights[t, k] * (m2 @ (F.silu(gu[:inter]) * gu[inter:]))
    return out


def test_grouped_expert_lora_matches_merged_weights_per_token():
    g = torch.Generator().manual_seed(0)
    tokens, hidden, inter, experts, top_k = 23, 16, 12, 6, 2
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.3
    slots = [
        _random_lora(g, experts, hidden, inter, 3),
        None,
        _random_lora(g, experts, hidden, inter, 2),
    ]
    token_slot = torch.randint(-1, 3, (tokens,), generator=g)
    lora = ExpertLoraBatch(token_slot, slots)
    router = torch.randn(experts, hidden, generator=g)
    logits = add_router_lora(F.linear(x, router), x, lora)
    for t in range(tokens):  # the router delta is each token's own adapter's
        s = int(token_slot[t])
        want = router @ x[t]
        if s >= 0 and slots[s] is not None:
            want = want + slots[s].router_b @ (slots[s].router_a @ x[t])
        torch.testing.assert_close(logits[t], want, atol=1e-5, rtol=1e-5)
    weights, ids = softmax_topk(logits, top_k, renormalize=True)
    got = fused_experts_lora_torch(x, w13, w2, weights, ids, lora)
    want = _merged_reference(x, w13, w2, weights, ids, token_slot.tolist(), slots)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    base = fused_experts_lora_torch(
        x, w13, w2, weights, ids, ExpertLoraBatch(token_slot, [None] * 3)
    )
    assert (got - base).abs().max() > 1e-2  # the adapters really change the output


# ---- the engine against peft ----------------------------------------------------------------


def _peft_logprobs(hf, adapter_dir, tokens: list[int]) -> torch.Tensor:
    from peft import PeftModel

    model = copy.deepcopy(hf)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_expert_and_router_lora_in_the_engine_match_peft(tmp_path, arch):
    pytest.importorskip("peft")
    from support.expert_adapters import expert_adapter, moe_base, to_per_expert_layout
    from support.logit_spy import record_sampled_logits

    from loraplex.platform.engine import LLM, SamplingParams

    hf = moe_base(arch)
    hf.save_pretrained(str(tmp_path / "base"))
    fused = expert_adapter(hf, tmp_path / "fused", seed=11, r=4, lora_alpha=8)
    # Qwen2-MoE: `all-linear` also takes the shared expert and its gate (plain Linears)
    other = expert_adapter(hf, tmp_path / "other", seed=12, r=2, lora_alpha=4,
                           params=["mlp.experts.down_proj", "mlp.gate.weight"],
                           target_modules="all-linear" if arch == "qwen2_moe" else ["v_proj"])  # fmt: skip
    experts = hf.config.to_dict().get("num_local_experts") or hf.config.num_experts
    per_expert = to_per_expert_layout(fused, tmp_path / "per", experts, legacy=arch == "mixtral")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (11, 5, 17, 9)]
    refs = [fused, None, other, per_expert]
    oracle = [fused, None, other, fused]  # the per-expert layout means what the fused one does
    delta = _peft_logprobs(hf, fused, prompts[0]) - _peft_logprobs(hf, None, prompts[0])
    assert delta.abs().max() > 1e-2  # the adapter really changes the output
    llm = LLM(str(tmp_path / "base"), max_loras=3, block_size=4, max_num_batched_tokens=16,
              max_num_seqs=4, max_lora_rank=8)  # fmt: skip
    rows = record_sampled_logits(llm)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, adapters=[str(r) if r else None for r in refs])
    by_prompt = {int(rid.split("-")[-2]): torch.stack(rs) for rid, rs in rows.items()}
    assert llm.core.lora_runtime.metrics()["expert_lora_bytes"] > 0  # reported, outside the pool
    for i, (prompt, ref, out) in enumerate(zip(prompts, oracle, outs, strict=True)):
        seq = prompt + out.outputs[0].token_ids
        want = _peft_logprobs(hf, ref, seq[:-1])[len(prompt) - 1 :]
        got = torch.log_softmax(by_prompt[i], dim=-1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert out.outputs[0].token_ids == want.argmax(-1).tolist()  # greedy identical


def test_triton_expert_lora_kernels_match_the_torch_path() -> None:
    """Mixed adapters and base tokens, remote experts included (TRITON_INTERPRET=1 on CPU, in
    a fresh interpreter: triton reads the variable when its kernels are defined)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    script = Path(__file__).with_name("moe_expert_lora_triton_checks.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(errors) == {"decode_fp32", "rank_over_16_fp32", "prefill_fp32", "expert_map_fp32"}
    for case, (err, delta) in errors.items():
        assert delta > 0.1, case  # the adapters really change the output
        assert err <= 1e-4, (case, err)


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_expert_lora_over_quantized_experts_adds_to_the_dequantized_weights(kind):
    """Quantized expert stacks (as a quantized deployment holds them) with expert LoRA: the
    adapter's delta adds to what the codes mean (their dequantized weights)."""
    from loraplex.loader.quant.schemes import QuantScheme, resolve_scheme
    from loraplex.moe.layer import MoEBlock
    from loraplex.moe.spec import MoESpec

    g = torch.Generator().manual_seed(3)
    h, i, e = 128, 128, 4
    scheme = resolve_scheme(kind)
    assert isinstance(scheme, QuantScheme)
    block = MoEBlock(MoESpec(h, i, e, _gating()), quant=scheme)
    block.load_weight("gate.weight", torch.randn(e, h, generator=g))
    block.load_weight("experts.gate_up_proj", torch.randn(e, 2 * i, h, generator=g) * 0.1)
    block.load_weight("experts.down_proj", torch.randn(e, h, i, generator=g) * 0.1)
    w13, w2 = block.stack("w13"), block.stack("w2")
    dense13 = torch.stack([w13.dequantize(x, torch.float32) for x in range(e)])
    dense2 = torch.stack([w2.dequantize(x, torch.float32) for x in range(e)])
    x = torch.randn(7, h, generator=g)
    lora = ExpertLoraBatch(
        torch.tensor([0, -1, 0, 1, 1, -1, 0]),
        [_random_lora(g, e, h, i, 4, router=False), _random_lora(g, e, h, i, 2, router=False)],
    )
    weights, ids = softmax_topk(torch.randn(7, e, generator=g), 2, renormalize=True)
    got = fused_experts_lora_torch(x, w13, w2, weights, ids, lora)
    want = fused_experts_lora_torch(x, dense13, dense2, weights, ids, lora)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)


def _gating():
    from loraplex.moe.gating import GatingConfig

    return GatingConfig(top_k=2, renormalize=True)


def test_steps_with_expert_lora_never_replay_a_captured_decode_graph(tmp_path):
    """A captured decode graph replays without running the blocks' Python forward, so expert
    LoRA would be skipped: such steps run eager (base and attention-only steps may replay)."""
    import types

    from support.expert_adapters import expert_adapter, moe_base

    from loraplex.platform.engine import LLM, SamplingParams

    hf = moe_base("qwen3_moe")
    hf.save_pretrained(str(tmp_path / "base"))
    adapter = str(expert_adapter(hf, tmp_path / "a", seed=3))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    args = dict(max_loras=2, block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
                max_lora_rank=8)  # fmt: skip
    llm = LLM(str(tmp_path / "base"), **args)
    want = llm.generate([[5, 6, 7]], params, adapters=[adapter])
    runner = llm.core.runner
    replays = []
    runner.decode_graphs = {b: lambda b=b: replays.append(b) for b in (1, 2, 4)}
    runner.decode_graphs_have_lora = True
    got = llm.generate([[5, 6, 7]], params, adapters=[adapter])
    assert replays == [] and got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    runner.lora_metadata = types.SimpleNamespace(eager_only=False)
    assert runner._lora_graphable()  # attention-only LoRA steps still replay graphs

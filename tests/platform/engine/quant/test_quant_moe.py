"""int8 / int4 / fp8 on a MoE base quantize the routed experts too: a tiny Mixtral served
quantized matches transformers run on the dequantized attention and expert weights (mixed
prefill/decode batches through the paged KV cache, both checkpoint layouts), attention LoRA
over the quantized MoE base matches peft over the dequantized one, and `/state`'s weight bytes
shrink to about a half (int8) / a quarter (int4) of bf16."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.logit_spy import record_sampled_logits
from support.paged_harness import PagedHarness, hf_logits, run_mixed_scenario  # noqa: E402
from support.peft_adapters import make_adapter  # noqa: E402
from support.quant_reference import dequantized_moe_copy  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.moe.layer import MoEBlock  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

transformers = pytest.importorskip("transformers")

# widths in whole int4 groups of 128; rows multiples of 16 (PyTorch's CPU int4 packer)
SIZES = dict(
    hidden_size=128, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    num_local_experts=4, num_experts_per_tok=2,
)  # fmt: skip
ENGINE = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
CHOICES = ["int8", "int4", "int4_sym", "fp8"]
CODE_DTYPES = {"int8": torch.int8, "int4": torch.uint8, "fp8": torch.float8_e4m3fn}


def _save(path: Path, layout: str, **sizes) -> torch.nn.Module:
    hf = save_tiny_model(path, "mixtral", seed=5, with_tokenizer=False, **{**SIZES, **sizes})
    if layout == "fused":  # transformers' in-memory 3-D expert tensors instead of per-expert
        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        assert any(k.endswith("experts.gate_up_proj") for k in state)
        (file,) = path.glob("*.safetensors")
        save_file(state, str(file))
    return hf


def _weight_only(core: EngineCore) -> None:
    """fp8 attention runs W8A8 on CPU; compare its weight-only path (the Linear tests check
    W8A8). The experts are always weight-only."""
    for m in core.model.modules():
        if getattr(m, "quant_method", None) is not None:
            m.fp8_w8a8 = False


def _blocks(core: EngineCore) -> list[MoEBlock]:
    return [m for m in core.model.modules() if isinstance(m, MoEBlock)]


@pytest.mark.parametrize(
    ("choice", "layout"),
    [(c, "per_expert") for c in CHOICES] + [("int8", "fused"), ("int4", "fused")],
)
def test_quantized_moe_matches_transformers_on_dequantized_weights(tmp_path, choice, layout):
    hf = _save(tmp_path, layout)
    core = EngineCore(EngineConfig(str(tmp_path), quantization=choice, dtype="float32", **ENGINE))
    _weight_only(core)
    blocks = _blocks(core)
    assert len(blocks) == 2
    kind = "int4" if choice.startswith("int4") else choice
    for block in blocks:
        assert block.quant_kind == kind
        assert block.w13.dtype == block.w2.dtype == CODE_DTYPES[kind]
    if kind == "int4":  # PyTorch's packed CPU int4 kernel serves them
        assert all(b.cpu_int4 for b in blocks)
    ref = dequantized_moe_copy(hf, choice)
    run_mixed_scenario(core.model, ref, atol=2e-4)
    # float experts under quantized attention would be far off: the experts' quantization is
    # what the comparison above checks
    tokens = list(range(3, 40))
    got = PagedHarness(core.model, num_blocks=32, block_size=4).step([("t", tokens)])[0]
    attention_only = hf_logits(dequantized_moe_copy(hf, choice, experts=False), tokens)
    assert (got - attention_only).abs().max() > 1e-2


@pytest.mark.parametrize("choice", ["int8", "int4", "fp8"])
def test_quantized_qwen2_moe_shared_expert_and_dense_layer(tmp_path, choice):
    # layer 0 sparse with a gated shared expert, layer 1 a dense MLP (mlp_only_layers)
    hf = save_tiny_model(
        tmp_path, "qwen2_moe", seed=6, with_tokenizer=False, hidden_size=128,
        intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        mlp_only_layers=[1], norm_topk_prob=False,
    )  # fmt: skip
    core = EngineCore(EngineConfig(str(tmp_path), quantization=choice, dtype="float32", **ENGINE))
    _weight_only(core)
    (block,) = _blocks(core)
    for t in (block.w13, block.w2, block.shared_w13, block.shared_w2):
        assert t.dtype == CODE_DTYPES[choice]
    assert block.shared_gate.dtype == torch.float32
    run_mixed_scenario(core.model, dequantized_moe_copy(hf, choice), atol=2e-4)


@pytest.mark.parametrize("choice", ["int8", "int4"])
def test_quantized_moe_in_bf16_stays_close(tmp_path, choice):
    hf = _save(tmp_path, "per_expert")
    core = EngineCore(EngineConfig(str(tmp_path), quantization=choice, dtype="bfloat16", **ENGINE))
    assert _blocks(core)[0].w13_scale.dtype == torch.bfloat16
    tokens = list(range(3, 60))
    got = PagedHarness(core.model, num_blocks=32, block_size=4, dtype=torch.bfloat16).step(
        [("s", tokens)]
    )[0]
    want = hf_logits(dequantized_moe_copy(hf, choice), tokens)
    scale = want.abs().max()
    err = (got.float() - want).abs().amax(dim=-1) / scale  # per position
    # bf16 can flip a near-tie in the router (a different expert for that row, and later
    # positions attend to it): a few positions move; the rest track the dequantized model as
    # closely as a bf16 engine tracks the fp32 float model (median ~0.01 here)
    assert (err > 0.05).float().mean() <= 0.1, err
    assert err.median() < 0.02, err
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1 * scale
    assert clear.sum() >= 5
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_quantized_moe_weight_bytes_on_state(tmp_path):
    # experts dominate the model, as in real MoE bases
    _save(tmp_path, "per_expert", intermediate_size=512, num_local_experts=8)
    sizes, expert_bytes = {}, {}
    for choice in ("bf16", "int8", "int4", "int4_sym", "fp8"):
        core = EngineCore(
            EngineConfig(str(tmp_path), quantization=choice, dtype="bfloat16", **ENGINE)
        )
        sizes[choice] = core.state().weight_bytes
        assert sizes[choice] == core.weight_bytes
        expert_bytes[choice] = sum(
            t.numel() * t.element_size()
            for b in _blocks(core)
            for t in (b.w13, b.w2, b.w13_scale, b.w2_scale)
            if t is not None
        )
    ratio = {c: sizes[c] / sizes["bf16"] for c in sizes}
    assert 0.45 < ratio["int8"] < 0.55, ratio
    assert 0.45 < ratio["fp8"] < 0.55, ratio
    assert 0.22 < ratio["int4"] < 0.30, ratio
    assert ratio["int4_sym"] == ratio["int4"]  # (s, zf) per group either way
    # the experts themselves: 1 byte (int8/fp8) or half a byte (int4) a weight, plus scales
    assert expert_bytes["int8"] / expert_bytes["bf16"] == pytest.approx(0.5, abs=0.01)
    assert expert_bytes["int4"] / expert_bytes["bf16"] == pytest.approx(0.25 + 1 / 64, abs=0.01)


def test_int4_experts_need_whole_groups(tmp_path):
    _save(tmp_path, "per_expert", intermediate_size=96)
    with pytest.raises(ValueError, match="divisible by the group size 128"):
        EngineCore(EngineConfig(str(tmp_path), quantization="int4", **ENGINE))


@pytest.mark.parametrize("choice", ["int8", "int4", "fp8"])
def test_attention_lora_over_quantized_moe_matches_peft(tmp_path, choice):
    from peft import PeftModel

    hf = _save(tmp_path / "base", "per_expert")
    hf.generation_config.eos_token_id = None
    adapter = make_adapter(
        hf, tmp_path / "lora", seed=21, r=8, lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )  # fmt: skip
    llm = LLM(str(tmp_path / "base"), quantization=choice, max_loras=2, dtype="float32", **ENGINE)
    assert _blocks(llm.core)[0].quant_kind == choice
    _weight_only(llm.core)
    rows = record_sampled_logits(llm)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (13, 6)]
    refs = [adapter, None]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, adapters=[str(r) if r else None for r in refs])
    deq = dequantized_moe_copy(hf, choice)
    peft = PeftModel.from_pretrained(deq, str(adapter)).eval()
    by_prompt = {int(rid.split("-")[-2]): torch.stack(r) for rid, r in rows.items()}
    for i, (prompt, ref, out) in enumerate(zip(prompts, refs, outs, strict=True)):
        seq = prompt + out.outputs[0].token_ids
        with torch.no_grad():
            if ref is None:
                with peft.disable_adapter():
                    want = hf_logits(peft, seq[:-1])[len(prompt) - 1 :]
            else:
                want = hf_logits(peft, seq[:-1])[len(prompt) - 1 :]
                with peft.disable_adapter():
                    base = hf_logits(peft, seq[:-1])[len(prompt) - 1 :]
                assert (want - base).abs().max() > 0.05  # the adapter really moves the output
        err = ((by_prompt[i] - want).abs().max() / want.abs().max()).item()
        assert err < 1e-3, (i, err)


@pytest.mark.parametrize("choice", ["int4"])
def test_expert_parallel_engine_serves_quantized_experts(tmp_path, choice):
    from loraplex.platform.engine.ep_engine import start_ep_engine
    from loraplex.platform.engine.sampling_params import SamplingParams

    _save(tmp_path, "per_expert")
    config = EngineConfig(
        model=str(tmp_path), quantization=choice, max_num_seqs=4, max_num_batched_tokens=64,
        max_model_len=64, block_size=4, num_gpu_blocks=64,
    )  # fmt: skip
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]

    def generate(engine, rebalance_after=None) -> list[list[int]]:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        reqs = [engine.add_request(p, params) for p in prompts]
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
            if steps == rebalance_after:  # moves quantized experts (codes and scales) between ranks
                engine.rebalance()
        return [list(r.output_token_ids) for r in reqs]

    single = EngineCore(config)
    assert _blocks(single)[0].quant_kind == "int4"
    want = generate(single)
    engine = start_ep_engine(config, 2, num_redundant=2, backend="gloo")
    try:
        got = generate(engine, rebalance_after=2)
        assert engine.last_rebalance
    finally:
        engine.close()
    assert got == want

"""AWQ (gemm) and GPTQ checkpoints packed by AutoAWQ / AutoGPTQ load in the engine as they are
(GPTQ with and without act-order) and match transformers on the closed-form dequantized weights;
LoRA over each matches peft over the dequantized base; choices that contradict the checkpoint,
and layouts the engine does not read, are refused saying what is served."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.awq_gptq_checkpoints import VARIANTS, libraries_installed, save_awq_gptq  # noqa: E402
from support.paged_harness import PagedHarness  # noqa: E402
from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

pytestmark = pytest.mark.skipif(
    not libraries_installed(), reason="autoawq / auto-gptq (the oracles' packers) not installed"
)

# two groups of 128 on every input (four on down_proj), so act-order really permutes groups
SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
ENGINE = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("awq-gptq-src")
    return path, save_tiny_model(path, "llama", seed=8, **SIZES)


@pytest.fixture(scope="module")
def checkpoints(src, tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    path, hf = src
    out = {}
    for variant in VARIANTS:
        dest = tmp_path_factory.mktemp(variant)
        out[variant] = (dest, save_awq_gptq(hf, path, dest, variant, seed=3))
    return out


def _logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_checkpoint_matches_transformers_on_dequantized_weights(src, checkpoints, variant) -> None:
    path, reference = checkpoints[variant]
    method, _, act_order = VARIANTS[variant]
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == method
    core = EngineCore(EngineConfig(str(path), dtype="float32", **ENGINE))
    assert core.weight_quantization == method
    qkv = core.model.model.layers[0].self_attn.qkv_proj
    assert qkv.quant_method is not None and qkv.quant_kernel == "cpu_int4pack"
    # act-order: the input order is a real permutation, kept to gather the activations
    assert (getattr(qkv, "input_perm", None) is not None) == act_order
    tokens = list(range(3, 60))
    got = PagedHarness(core.model, num_blocks=32, block_size=4).step([("s", tokens)])[0]
    want = _logits(reference, tokens)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-4, err
    plain = _logits(src[1], tokens)  # the quantized weights really differ from the source
    assert ((plain - want).abs().max() / want.abs().max()).item() > 100 * err


@pytest.mark.parametrize("variant", ["awq", "gptq_asym_act_order"])
def test_lora_over_the_checkpoint_matches_peft(checkpoints, variant, tmp_path) -> None:
    from peft import PeftModel

    path, reference = checkpoints[variant]
    adapter = make_adapter(reference, tmp_path / "a", seed=4, r=8, lora_alpha=16,
                           target_modules="all-linear")  # fmt: skip
    llm = LLM(str(path), dtype="float32", max_loras=2, max_lora_rank=16, **ENGINE)
    prompt = list(range(5, 25))
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                       adapters=[str(adapter)])[0]  # fmt: skip
    peft = PeftModel.from_pretrained(copy.deepcopy(reference), str(adapter)).eval()
    seq = prompt + out.outputs[0].token_ids
    want_logits = _logits(peft, seq)[len(prompt) - 1 : -1]
    assert want_logits.argmax(-1).tolist() == out.outputs[0].token_ids
    base = _logits(reference, seq)[len(prompt) - 1 : -1]  # the adapter changes the outputs
    assert not torch.allclose(base, want_logits, atol=1e-3)


def test_a_choice_against_the_checkpoint_scheme_is_refused(checkpoints) -> None:
    path, _ = checkpoints["gptq_sym"]
    for choice in ("int4", "awq", "int8"):
        with pytest.raises(
            ValueError, match="fixes its own scheme; serve it with quantization 'gptq'"
        ):
            EngineCore(EngineConfig(str(path), quantization=choice, **ENGINE))
    assert (
        EngineCore(EngineConfig(str(path), quantization="gptq", **ENGINE)).weight_quantization
        == "gptq"
    )


def test_a_plain_checkpoint_is_not_served_as_awq(src) -> None:
    with pytest.raises(ValueError, match="use int4"):
        EngineCore(EngineConfig(str(src[0]), quantization="awq", **ENGINE))


def _with_config(checkpoints, variant: str, tmp_path: Path, **changes) -> Path:
    path = tmp_path / "ckpt"
    shutil.copytree(checkpoints[variant][0], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"].update(changes)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    "variant, changes, what",
    [
        ("awq", {"version": "gemv"}, "version 'gemv'"),
        ("awq", {"bits": 8}, "bits 8"),
        ("gptq_sym", {"group_size": 64}, "group_size 64"),
        ("gptq_sym", {"checkpoint_format": "gptq_v2"}, "checkpoint_format 'gptq_v2'"),
    ],
)
def test_unread_layouts_are_refused_naming_what_is_served(
    checkpoints, tmp_path, variant, changes, what
) -> None:
    path = _with_config(checkpoints, variant, tmp_path, **changes)
    with pytest.raises(NotImplementedError, match=f"{what}.*served: AWQ version gemm"):
        EngineCore(EngineConfig(str(path), **ENGINE))


def test_act_order_slices_of_one_input_must_share_their_order(checkpoints, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    path = tmp_path / "ckpt"
    shutil.copytree(checkpoints["gptq_sym_act_order"][0], path)
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.self_attn.k_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()  # another (valid) act-order grouping
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="fused layer serves one input order"):
        EngineCore(EngineConfig(str(path), **ENGINE))

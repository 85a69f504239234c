"""Checkpoints packed by the compressed-tensors library (int4 pack-quantized sym/asym, int8,
fp8) load in the engine as they are and match transformers on the library's decompressed
weights; LoRA over one matches peft over the decompressed base; a choice contradicting the
checkpoint's own scheme is refused."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("compressed_tensors")

from support.compressed_checkpoints import SCHEMES, save_compressed  # noqa: E402
from support.paged_harness import PagedHarness  # noqa: E402
from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

SIZES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
ENGINE = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    return save_tiny_model(tmp_path_factory.mktemp("ct-src"), "llama", seed=8, **SIZES)


@pytest.fixture(scope="module")
def checkpoints(hf, tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    out = {}
    for choice in SCHEMES:
        path = tmp_path_factory.mktemp(f"ct-{choice}")
        out[choice] = (path, save_compressed(hf, path, choice))
    return out


def _logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("choice", list(SCHEMES))
def test_compressed_checkpoint_matches_transformers_on_decompressed_weights(
    hf, checkpoints, choice: str
) -> None:
    path, decompressed = checkpoints[choice]
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    core = EngineCore(EngineConfig(str(path), dtype="float32", **ENGINE))
    layer = core.model.model.layers[0]
    assert layer.mlp.down_proj.quant_method is not None
    assert core.weight_quantization == choice
    for m in core.model.modules():  # fp8: the weight-only path, exactly comparable
        if getattr(m, "quant_method", None) is not None:
            m.fp8_w8a8 = False
    tokens = list(range(3, 60))
    got = PagedHarness(core.model, num_blocks=32, block_size=4).step([("s", tokens)])[0]
    want = _logits(decompressed, tokens)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-4, err
    plain = _logits(hf, tokens)  # the checkpoint's quantization is real
    assert ((plain - want).abs().max() / want.abs().max()).item() > 100 * err


def test_lora_over_a_compressed_checkpoint_matches_peft(hf, checkpoints, tmp_path) -> None:
    from peft import PeftModel

    path, decompressed = checkpoints["int4"]
    adapter = make_adapter(hf, tmp_path / "a", seed=4, r=8, lora_alpha=16,
                           target_modules="all-linear")  # fmt: skip
    llm = LLM(str(path), dtype="float32", max_loras=2, max_lora_rank=16, **ENGINE)
    prompt = list(range(5, 25))
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                       adapters=[str(adapter)])[0]  # fmt: skip
    peft = PeftModel.from_pretrained(copy.deepcopy(decompressed), str(adapter)).eval()
    seq = prompt + out.outputs[0].token_ids
    want = _logits(peft, seq)[len(prompt) - 1 : -1].argmax(-1).tolist()
    assert want == out.outputs[0].token_ids


def test_a_choice_against_the_checkpoint_scheme_is_refused(checkpoints) -> None:
    path, _ = checkpoints["int4"]
    with pytest.raises(ValueError, match="fixes its own scheme; serve it with quantization 'int4'"):
        EngineCore(EngineConfig(str(path), quantization="int8", **ENGINE))
    core = EngineCore(EngineConfig(str(path), quantization="int4", **ENGINE))
    assert core.weight_quantization == "int4"

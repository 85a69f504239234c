"""The deployment's weight quantization on load: bf16 / fp16 casts run close to fp32; int4 on
a model whose widths are not multiples of 128 is refused; pre-quantized formats are not
re-quantized; unknown choices are rejected. (int8 / int4 / fp8 serving: `quant/`.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.paged_harness import PagedHarness  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine.layers.onednn_weights import dense  # noqa: E402
from loraplex.platform.engine.weight_quantization import (  # noqa: E402
    resolve_weight_quantization,
)
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

ENGINE = dict(block_size=8, max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-quant")
    save_tiny_model(path, "llama", seed=11, with_tokenizer=False)
    return path


def _logits(core: EngineCore, dtype: torch.dtype, tokens: list[int]) -> torch.Tensor:
    harness = PagedHarness(core.model, num_blocks=16, block_size=4, dtype=dtype)
    return harness.step([("s", tokens)])[0].float()


@pytest.mark.parametrize(("choice", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_cast_on_load_stays_close_to_fp32(tiny: Path, choice: str, dtype: torch.dtype) -> None:
    ref = EngineCore(EngineConfig(str(tiny), **ENGINE))
    low = EngineCore(EngineConfig(str(tiny), quantization=choice, **ENGINE))
    assert low.dtype == dtype
    assert {p.dtype for p in low.model.parameters()} == {dtype}
    assert low.runner.kv_caches[0].dtype == dtype
    for name, p in low.model.named_parameters():  # each weight is the fp32 one, rounded
        want = dict(ref.model.named_parameters())[name].to(dtype)
        assert torch.equal(dense(p), want), name  # bf16 Linears are packed for oneDNN
    tokens = list(range(3, 40))
    want, got = _logits(ref, torch.float32, tokens), _logits(low, dtype, tokens)
    scale = want.abs().max()
    assert scale > 0.5
    err = (got - want).abs().max() / scale
    assert 0 < err < 0.03, err
    # the next-token choice agrees wherever fp32 has a clear winner
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1 * scale
    assert clear.sum() >= 5
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
    assert "quantize" in low.timeline.seconds


def test_fp32_choice_is_a_plain_load(tiny: Path) -> None:
    core = EngineCore(EngineConfig(str(tiny), quantization="fp32", **ENGINE))
    assert core.dtype == torch.float32


def test_int4_needs_widths_in_whole_groups(tiny: Path) -> None:
    with pytest.raises(ValueError, match="divisible by the group size 128"):
        EngineCore(EngineConfig(str(tiny), quantization="int4"))


@pytest.mark.parametrize("choice", ["awq", "gptq"])
def test_prequantized_formats_are_not_requantized(tiny: Path, choice: str) -> None:
    # awq / gptq read a checkpoint in that format; a plain checkpoint is never quantized to one
    with pytest.raises(ValueError, match="not one .* use int4"):
        EngineCore(EngineConfig(str(tiny), quantization=choice))


@pytest.mark.parametrize("choice", ["int3", "bf17", "fast"])
def test_unknown_choices_are_rejected(tiny: Path, choice: str) -> None:
    with pytest.raises(ValueError, match="unknown weight quantization"):
        EngineCore(EngineConfig(str(tiny), quantization=choice))


def test_no_choice_means_no_quantizer() -> None:
    assert resolve_weight_quantization(None).quantizer() is None
    assert resolve_weight_quantization("BF16").cast_to == torch.bfloat16

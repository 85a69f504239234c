"""compressed-tensors checkpoints once refused: int8 weights in groups of 128 (w8a16, group 128)
and fp8 with static (calibrated, per-tensor) activation scales. Packed by the library itself;
the engine's forward equals the library's own decompressed forward, which for fp8-static
quantizes each Linear's input with its scale (a weight-only reading of the same checkpoint
differs, and the test says by how much)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("compressed_tensors")

from support.paged_harness import PagedHarness  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

SIZES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
ENGINE = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
TOKENS = list(range(3, 60))
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)

CASES = {
    "int8_g128": (dict(num_bits=8, type="int", strategy="group", group_size=128, symmetric=True),
                  None, "int-quantized"),
    "int8_g128_packed": (
        dict(num_bits=8, type="int", strategy="group", group_size=128, symmetric=True),
        None, "pack-quantized"),
    "fp8_static": (dict(num_bits=8, type="float", strategy="channel", symmetric=True),
                   dict(num_bits=8, type="float", strategy="tensor", symmetric=True,
                        dynamic=False), "float-quantized"),
}  # fmt: skip


def _input_amax(hf: torch.nn.Module) -> dict[str, float]:
    """Calibration: the largest |input| each Linear sees on the test prompt."""
    amax: dict[str, float] = {}

    def hook(name):
        def record(_m, inp, _out):
            amax[name] = max(amax.get(name, 0.0), float(inp[0].abs().max()))

        return record

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in hf.named_modules()
        if isinstance(m, torch.nn.Linear) and n != "lm_head"
    ]
    with torch.no_grad():
        hf(torch.tensor([TOKENS]))
    for h in handles:
        h.remove()
    return amax


def save_compressed_case(hf: torch.nn.Module, out: Path, case: str) -> torch.nn.Module:
    """Quantize and compress `hf` with the library as `case` says; returns its decompressed
    model (the oracle: its forward applies the checkpoint's activation quantization)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    weights, acts, fmt = CASES[case]
    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(
        targets=["Linear"], weights=args,
        input_activations=QuantizationArgs(**acts) if acts else None,
    )  # fmt: skip
    amax = _input_amax(hf)
    model = copy.deepcopy(hf)
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    )
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not hasattr(mod, "weight_scale"):
                continue
            w = mod.weight.data
            if args.strategy == "group":
                w = w.view(w.shape[0], -1, args.group_size)
            scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), args)
            mod.weight_scale.data.copy_(scale.reshape(mod.weight_scale.shape))
            if hasattr(mod, "weight_zero_point"):
                mod.weight_zero_point.data.copy_(zero.reshape(mod.weight_zero_point.shape))
            if hasattr(mod, "input_scale"):
                mod.input_scale.data.fill_(amax[name] / FP8_MAX * 0.8)  # some inputs clip
    compressor = ModelCompressor.from_pretrained_model(model, fmt)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    compressor.decompress_model(model)
    return model.eval()


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    return save_tiny_model(tmp_path_factory.mktemp("ct2-src"), "llama", seed=8, **SIZES)


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].float()


def _weight_only(hf: torch.nn.Module, decompressed: torch.nn.Module) -> torch.Tensor:
    """The same checkpoint read weight-only: decompressed weights, activations untouched."""
    plain = copy.deepcopy(hf)
    with torch.no_grad():
        for name, mod in decompressed.named_modules():
            if hasattr(mod, "weight_scale"):
                plain.get_submodule(name).weight.copy_(mod.weight)
    return _logits(plain)


@pytest.mark.parametrize("case", list(CASES))
def test_refused_schemes_are_served_as_the_library_runs_them(hf, tmp_path, case: str) -> None:
    decompressed = save_compressed_case(hf, tmp_path, case)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    core = EngineCore(EngineConfig(str(tmp_path), dtype="float32", **ENGINE))
    assert (
        core.weight_quantization == case.split("_")[0]
    )  # int8 / fp8: the family a deployment names
    got = PagedHarness(core.model, num_blocks=32, block_size=4).step([("s", TOKENS)])[0]
    want = _logits(decompressed)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-4, err
    plain = _logits(hf)  # the checkpoint's quantization is real
    assert ((plain - want).abs().max() / want.abs().max()).item() > 100 * err
    if case == "fp8_static":  # activations quantized as the checkpoint says: not weight-only
        weight_only = _weight_only(hf, decompressed)
        gap = ((weight_only - want).abs().max() / want.abs().max()).item()
        assert gap > 100 * err, (gap, err)


@pytest.mark.parametrize("case", list(CASES))
def test_the_control_plane_deploys_them_with_their_own_scheme(hf, tmp_path, case: str) -> None:
    from loraplex.platform.engine_spec.quantization import check_quantization, checkpoint_choice

    save_compressed_case(hf, tmp_path, case)
    config = json.loads((tmp_path / "config.json").read_text())
    family = case.split("_")[0]
    assert checkpoint_choice(config) == family
    check_quantization(family, "auto", config)  # no refusal

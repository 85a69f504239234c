"""Pre-quantized checkpoints packed by the `compressed-tensors` library itself (the oracle's own
format and packer): a transformers model, its Linear weights quantized with the library's
qparams and compressed, saved with the library's `quantization_config`; plus the same model
decompressed by the library (what transformers runs as the reference)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

# our choice -> (the library's weight args, its format)
SCHEMES = {
    "int4_sym": (dict(num_bits=4, type="int", strategy="group", group_size=128, symmetric=True),
                 "pack-quantized"),
    "int4": (dict(num_bits=4, type="int", strategy="group", group_size=128, symmetric=False),
             "pack-quantized"),
    "int8": (dict(num_bits=8, type="int", strategy="channel", symmetric=True), "int-quantized"),
    "fp8": (dict(num_bits=8, type="float", strategy="channel", symmetric=True),
            "float-quantized"),
}  # fmt: skip


def save_compressed(hf: torch.nn.Module, out: Path, choice: str) -> torch.nn.Module:
    """Quantize `hf`'s Linears (not lm_head) with compressed-tensors as `choice`, save the
    compressed checkpoint to `out`; returns the library's decompressed model (the reference)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    weights, fmt = SCHEMES[choice]
    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    model = copy.deepcopy(hf)
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    )
    with torch.no_grad():
        for mod in model.modules():
            if not hasattr(mod, "weight_scale"):
                continue
            w = mod.weight.data
            if args.strategy == "group":
                w = w.view(w.shape[0], -1, args.group_size)
            lo, hi = w.amin(-1), w.amax(-1)
            scale, zero = calculate_qparams(lo, hi, args)
            mod.weight_scale.data.copy_(scale.reshape(mod.weight_scale.shape))
            if hasattr(mod, "weight_zero_point"):
                mod.weight_zero_point.data.copy_(zero.reshape(mod.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, fmt)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    compressor.decompress_model(model)
    return model.eval()

"""Compatibility names for `loraplex.loader.quant` (the loader's quantization package)."""

from loraplex.loader.quant.quantizer import DEFAULT_SKIP, Quantizer
from loraplex.loader.quant.schemes import parse_quantization
from loraplex.loader.quant.weight_only import dequantize_int8, quantize_int8_per_channel

DEFAULT_INT8_SKIP = DEFAULT_SKIP

__all__ = [
    "DEFAULT_INT8_SKIP",
    "Quantizer",
    "dequantize_int8",
    "parse_quantization",
    "quantize_int8_per_channel",
]

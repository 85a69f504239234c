"""Weight quantization on the way in, and readers of pre-quantized checkpoints.

`schemes` parses a deployment's choice; `weight_only` holds the int8 / int4 / fp8 quantizers
and their dequantizers (the reference the engine's kernels are tested against); `quantizer`
applies a choice to each checkpoint tensor as it streams in. Every scheme emits one canonical
layout per linear weight that the engine's quantized Linear loads: `<p>.weight` (int8, uint8
int4 codes, or fp8), `<p>.weight_scale`, and for asymmetric int4 `<p>.weight_zero`.
"""

from loraplex.loader.quant.quantizer import Quantizer
from loraplex.loader.quant.schemes import QuantScheme, parse_quantization, resolve_scheme

__all__ = ["QuantScheme", "Quantizer", "parse_quantization", "resolve_scheme"]

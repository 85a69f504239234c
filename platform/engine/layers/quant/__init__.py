"""Quantized linear methods: how a Linear stores int8 / int4 / fp8 weights and runs its matmul.

A model built inside `linear_quantization(scheme)` gets a `QuantMethod` on every Linear; the
Linear then holds the method's tensors (codes, scales, zero points) instead of a float weight,
loads them slice by slice like a float weight, packs them for the kernel once loading is done
(`finish_loading`), and runs `method.apply` in forward. LoRA deltas are added on top unchanged.
"""

from loraplex.platform.engine.layers.quant.base import (
    QuantMethod,
    current_linear_scheme,
    linear_quantization,
    make_quant_method,
)

__all__ = ["QuantMethod", "current_linear_scheme", "linear_quantization", "make_quant_method"]

"""A quantized Linear's weight as the deterministic mode's fixed-order kernel reads it.

The codes stay the ones loaded (int8, fp8 as they are; int4 moved from PyTorch's CPU kernel
layout back to two codes a byte) and the scales become fp32 rows, so the mode keeps the
quantized memory footprint and multiplies by the same dequantized values: int8 and fp8 scale
each row's dot product, grouped int8 each code, int4 is `(q - 8) * s + zf` per group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.loader.quant_choices import QUANTIZED_ON_LOAD
from loraplex.moe.quant_experts import CPU_INT4_BLOCK, from_cpu_int4_layout, pack_nibbles
from loraplex.platform.engine.layers.fixed_order_cpu import FixedOrderWeight
from loraplex.platform.engine.layers.quant.int4 import Int4Method

COVERED_SCHEMES = QUANTIZED_ON_LOAD
"""Schemes quantized on load that the mode covers (pre-quantized checkpoints are not yet)."""

if TYPE_CHECKING:
    from loraplex.platform.engine.layers.linear import Linear


def uncovered_scheme(scheme: QuantScheme) -> str | None:
    """What of a Linear's scheme the mode does not cover, None when it covers it."""
    if scheme.name not in COVERED_SCHEMES:
        return f"pre-quantized {scheme.name} weights"
    if scheme.static_input or scheme.act_order:
        return f"{scheme.name} with static activation scales or act-order"
    return None


def _int4_codes(layer: Linear) -> torch.Tensor:
    """The layer's int4 codes [out, in] (0..15) from whichever layout it holds."""
    if layer.quant_kernel != "cpu_int4pack":
        return layer.weight.data
    packed = layer.weight.data
    if packed.shape[0] % CPU_INT4_BLOCK == 0:
        codes = from_cpu_int4_layout(packed)
        again = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        if torch.equal(again, packed):
            return codes
    raise NotImplementedError(
        f"the deterministic mode cannot read PyTorch's CPU int4 layout for {layer.out_features} "
        f"output rows (it reads multiples of {CPU_INT4_BLOCK})"
    )


def fixed_order_weight(layer: Linear) -> FixedOrderWeight:
    """`layer`'s (a quantized `Linear`) weight for the fixed-order kernel."""
    method = layer.quant_method
    if method is None:
        raise ValueError("a fixed-order quantized weight needs a quantized Linear")
    kind = method.scheme.kind
    if getattr(layer, "input_perm", None) is not None:
        raise NotImplementedError("the deterministic mode does not cover act-order int4 weights")
    if kind == "int8":
        scale = layer.weight_scale.data.float().contiguous()
        group = method.scheme.group_size if scale.dim() == 2 else 0
        return FixedOrderWeight("int8", layer.weight.data.contiguous(), scale, group=group)
    if kind == "fp8":
        codes = layer.weight.data.contiguous()
        return FixedOrderWeight("fp8", codes, layer.weight_scale.data.float().contiguous())
    if kind != "int4" or not isinstance(method, Int4Method):
        raise NotImplementedError(f"the deterministic mode does not cover {kind} weights")
    codes = _int4_codes(layer)
    if layer.quant_kernel == "cpu_int4pack":  # scale [G, out, 2]: (s, (8 - z) * s)
        sz = layer.weight_scale.data
        s, zf = (sz[..., i].t().float().contiguous() for i in (0, 1))
    else:
        s = layer.weight_scale.data.float().contiguous()
        zf = ((8.0 - method.zeros(layer).float()) * s).contiguous()
    return FixedOrderWeight("int4", pack_nibbles(codes).contiguous(), s, zf, method.group)

"""W8A16: int8 weights with one scale per output channel, activations in bf16/fp16/fp32.

On CPU the matmul is PyTorch's packed `torch._weight_int8pack_mm` (reads int8, scales in the
kernel) for up to `CPU_PACKED_MAX_ROWS` rows: it walks the weight once per row, so from there on
(prefill, large decode batches) the codes are cast to the activation dtype for one GEMM and the
scale applied to its output (measured, one thread, 2048x5632 bf16: at 1 row 2.7x faster than
bf16 F.linear; at 16 rows the packed kernel takes 14.6 ms, the cast-and-GEMM 9.4 ms); on CUDA it is the Triton W8A16 GEMM (`triton_weight_only`), which dequantizes in
registers; without triton the weight is dequantized to the activation dtype for the matmul.
`layer.quant_kernel` says which ("cpu_int8pack", "triton", "dequant").

Grouped int8 (a compressed-tensors checkpoint's w8a16 with `group_size` 128: one scale per
output row and group of 128 inputs, `weight_scale` [out, in/128]) is dequantized group by group
to the activation dtype for one GEMM on every device ("dequant_grouped"): the int8 codes stay
what is stored, the float weight exists only during the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.platform.engine.layers.quant.base import add_bias, frozen
from loraplex.platform.engine.layers.quant.triton_weight_only import (
    triton_weight_only_available,
    w8a16_matmul,
)

CPU_PACKED_MAX_ROWS = 15
"""Rows (tokens) up to which the CPU's packed int8 kernel beats casting the codes for a GEMM."""

if TYPE_CHECKING:
    from loraplex.platform.engine.layers.linear import Linear


class Int8Method:
    """Per-channel symmetric int8 weight-only linear."""

    def __init__(self, scheme: QuantScheme) -> None:
        self.scheme = scheme

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        layer.compute_dtype = dtype
        layer.quant_kernel = "dequant"
        layer.weight = frozen(torch.empty(layer.out_features, layer.in_features, dtype=torch.int8))
        group = self.scheme.group_size
        if group and layer.in_features % group:
            raise ValueError(
                f"grouped int8 needs in_features ({layer.in_features}) divisible by {group}"
            )
        shape = (layer.out_features, layer.in_features // group) if group else layer.out_features
        layer.weight_scale = frozen(torch.empty(shape, dtype=torch.float32))

    def finish_loading(self, layer: Linear) -> None:
        if self.scheme.group_size:
            layer.quant_kernel = "dequant_grouped"
        elif layer.weight.device.type == "cpu":
            layer.weight_scale = frozen(layer.weight_scale.data.to(layer.compute_dtype))
            layer.quant_kernel = "cpu_int8pack"
        elif triton_weight_only_available(layer.weight):
            self.use_triton(layer)

    def use_triton(self, layer: Linear) -> None:
        """Lay the loaded tensors out for the Triton W8A16 GEMM (CUDA; CPU tests under
        TRITON_INTERPRET=1 call it directly)."""
        layer.weight = frozen(layer.weight.data.contiguous())
        layer.weight_scale = frozen(layer.weight_scale.data.float().contiguous())
        layer.quant_kernel = "triton"

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if layer.quant_kernel == "dequant_grouped":
            out, inp = layer.weight.shape
            groups = layer.weight_scale.shape[1]
            codes = layer.weight.view(out, groups, inp // groups).to(x2.dtype)
            w = (codes * layer.weight_scale.to(x2.dtype)[..., None]).view(out, inp)
            y = F.linear(x2, w)
        elif layer.quant_kernel == "cpu_int8pack" and x2.device.type == "cpu":
            scale: torch.Tensor = layer.weight_scale
            if scale.dtype != x2.dtype:
                scale = scale.to(x2.dtype)
            if x2.shape[0] <= CPU_PACKED_MAX_ROWS:
                y = torch._weight_int8pack_mm(x2.contiguous(), layer.weight, scale)
            else:  # exact cast (|code| <= 127), one GEMM, the channel scale on the output
                y = F.linear(x2, layer.weight.to(x2.dtype)) * scale
        elif layer.quant_kernel == "triton":
            y = w8a16_matmul(x2, layer.weight, layer.weight_scale)
        else:
            w = layer.weight.to(x2.dtype) * layer.weight_scale.to(x2.dtype)[:, None]
            y = F.linear(x2, w)
        return add_bias(y.reshape(*shape[:-1], layer.out_features), layer)

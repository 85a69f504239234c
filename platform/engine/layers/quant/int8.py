"""W8A16: int8 weights with one scale per output channel, activations in bf16/fp16/fp32.

On CPU the matmul is PyTorch's packed `torch._weight_int8pack_mm` (reads int8, scales in the
kernel); elsewhere the weight is dequantized to the activation dtype for the matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.platform.engine.layers.quant.base import add_bias, frozen


class Int8Method:
    """Per-channel symmetric int8 weight-only linear."""

    def __init__(self, scheme: QuantScheme) -> None:
        self.scheme = scheme

    def create_weights(self, layer, dtype: torch.dtype) -> None:
        layer.compute_dtype = dtype
        layer.weight = frozen(torch.empty(layer.out_features, layer.in_features, dtype=torch.int8))
        layer.weight_scale = frozen(torch.empty(layer.out_features, dtype=torch.float32))

    def finish_loading(self, layer) -> None:
        layer.weight_scale = frozen(layer.weight_scale.data.to(layer.compute_dtype))

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.device.type == "cpu":
            scale = layer.weight_scale
            if scale.dtype != x2.dtype:
                scale = scale.to(x2.dtype)
            y = torch._weight_int8pack_mm(x2.contiguous(), layer.weight, scale)
        else:
            w = layer.weight.to(x2.dtype) * layer.weight_scale.to(x2.dtype)[:, None]
            y = F.linear(x2, w)
        return add_bias(y.reshape(*shape[:-1], layer.out_features), layer)

"""W4A16: int4 weights in groups of 128 inputs (symmetric or asymmetric), bf16 activations.

On CPU the codes are packed once for PyTorch's `torch._weight_int4pack_mm_for_cpu`, which
computes `w = (q - 8) * scale + zero_f` per group: an integer zero point z becomes
`zero_f = (8 - z) * scale`. On CUDA they are packed two a byte (`triton_weight_only.pack_int4`)
for the Triton W4A16 GEMM, which dequantizes in registers. Elsewhere (no triton, a group size
that is not a multiple of 32 on CUDA, or a CPU layer whose out_features is not a multiple of 16,
which the CPU packer needs) the codes stay one per byte and are dequantized for the matmul.
`layer.quant_kernel` says which ("cpu_int4pack", "triton", "dequant").

Act-order schemes (GPTQ `desc_act`) also load `input_perm` [in]: the checkpoint's groups are
spread over the inputs, so the reader stores the weight's input columns in the order that makes
every group contiguous, and apply gathers the activations by the same order first. That costs
one gather of x per call (a copy of tokens x in_features activations, no extra FLOPs) and an
int64 per input feature; an identity order (trivial g_idx) is dropped at load and costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.loader.quant.weight_only import dequantize_int4
from loraplex.platform.engine.layers.quant.base import add_bias, frozen
from loraplex.platform.engine.layers.quant.triton_weight_only import (
    W4A16_GROUP_MULTIPLE,
    pack_int4,
    triton_weight_only_available,
    w4a16_matmul,
)

if TYPE_CHECKING:
    from loraplex.platform.engine.layers.linear import Linear


class Int4Method:
    """Grouped int4 weight-only linear."""

    def __init__(self, scheme: QuantScheme) -> None:
        self.scheme = scheme
        self.group = scheme.group_size

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        if layer.in_features % self.group:
            raise ValueError(
                f"int4 needs in_features ({layer.in_features}) divisible by the group size "
                f"{self.group}"
            )
        groups = layer.in_features // self.group
        layer.compute_dtype = dtype
        layer.quant_kernel = "dequant"
        layer.weight = frozen(torch.empty(layer.out_features, layer.in_features, dtype=torch.uint8))
        layer.weight_scale = frozen(torch.empty(layer.out_features, groups, dtype=torch.float32))
        if not self.scheme.symmetric:
            layer.weight_zero = frozen(torch.empty(layer.out_features, groups, dtype=torch.float32))
        if self.scheme.act_order:  # -1: not loaded yet (every slice of a fused layer shares it)
            layer.input_perm = frozen(torch.full((layer.in_features,), -1, dtype=torch.int64))

    def zeros(self, layer: Linear) -> torch.Tensor:
        """The integer zero point of each group (8 everywhere when symmetric)."""
        if self.scheme.symmetric:
            return torch.full_like(layer.weight_scale, 8.0)
        return layer.weight_zero

    def finish_loading(self, layer: Linear) -> None:
        perm = getattr(layer, "input_perm", None)
        if perm is not None and torch.equal(perm, torch.arange(perm.numel(), device=perm.device)):
            layer.input_perm = None  # a trivial g_idx: nothing to gather
        if layer.weight.device.type == "cpu" and layer.out_features % 16 == 0:
            scale = layer.weight_scale.data.float()
            zero = self.zeros(layer).float()
            packed = torch._convert_weight_to_int4pack_for_cpu(layer.weight.data.to(torch.int32), 1)
            sz = torch.stack([scale, (8.0 - zero) * scale], dim=-1).transpose(0, 1)
            layer.weight = frozen(packed)
            layer.weight_scale = frozen(sz.contiguous().to(layer.compute_dtype))
            if not self.scheme.symmetric:
                del layer.weight_zero
            layer.quant_kernel = "cpu_int4pack"
        elif (
            layer.weight.device.type != "cpu"
            and triton_weight_only_available(layer.weight)
            and self.group % W4A16_GROUP_MULTIPLE == 0
        ):
            self.use_triton(layer)

    def use_triton(self, layer: Linear) -> None:
        """Pack the loaded codes two a byte for the Triton W4A16 GEMM (CUDA; CPU tests under
        TRITON_INTERPRET=1 call it directly)."""
        layer.weight = frozen(pack_int4(layer.weight.data))
        layer.weight_scale = frozen(layer.weight_scale.data.float().contiguous())
        if not self.scheme.symmetric:
            layer.weight_zero = frozen(layer.weight_zero.data.float().contiguous())
        layer.quant_kernel = "triton"

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        perm = getattr(layer, "input_perm", None)
        if perm is not None:
            x2 = x2.index_select(1, perm)
        if layer.quant_kernel == "cpu_int4pack" and x2.device.type == "cpu":
            sz: torch.Tensor = layer.weight_scale
            if sz.dtype != x2.dtype:
                sz = sz.to(x2.dtype)
            y = torch._weight_int4pack_mm_for_cpu(x2.contiguous(), layer.weight, self.group, sz)
        elif layer.quant_kernel == "triton":
            zero = None if self.scheme.symmetric else layer.weight_zero
            y = w4a16_matmul(x2, layer.weight, layer.weight_scale, zero, self.group)
        else:
            w = dequantize_int4(layer.weight, layer.weight_scale, self.zeros(layer), x2.dtype)
            y = F.linear(x2, w)
        return add_bias(y.reshape(*shape[:-1], layer.out_features), layer)

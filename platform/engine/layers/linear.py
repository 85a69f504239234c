"""The Linear seam: every projection a LoRA may target goes through these modules.

Forward is `y = x @ W^T (+ b)`; when the multi-LoRA runtime has set `lora_delta`, it is called as
`lora_delta(x, y, module)` and adds the batched low-rank delta into `y` in place. With
`lora_delta` None the cost is one attribute check on top of the matmul.

A Linear built inside `layers.quant.linear_quantization(scheme)` stores its weight quantized
(`quant_method`: int8 / int4 / fp8 codes plus `weight_scale`, maybe `weight_zero`); every one of
those tensors has output channels as rows, so slices load the same way. The LoRA delta still
runs in the activation dtype on top of the quantized matmul.

A plain bf16 weight on a CPU with native bf16 is packed for oneDNN once loaded
(`onednn_weights`): `weight` then holds the packed tensor, same shape and values, and forward
pays one layout check to pick the packed call (`onednn_weights.dense` reads the plain one back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.platform.engine.layers.fixed_order_cpu import FixedOrderWeight, fixed_order_linear
from loraplex.platform.engine.layers.onednn_weights import (
    can_pack,
    is_packed,
    pack_weight,
    packed_linear,
)
from loraplex.platform.engine.layers.quant.base import (
    QuantMethod,
    current_linear_scheme,
    make_quant_method,
)

LoraDelta = Callable[[torch.Tensor, torch.Tensor, "Linear"], None]


class Linear(nn.Module):
    """A projection with named output slices (one slice unless it is a fused MergedLinear).

    `layer_idx` is the decoder layer it belongs to; `slice_names` are the HuggingFace module
    names of its output slices (e.g. `["o_proj"]`), `slice_sizes` their output widths.
    """

    # What a quantized weight's method (`layers.quant`) registers on the layer: its tensors
    # (`weight_zero`, `input_scale`, `input_perm` only for the schemes that have them) and
    # the kernel it chose once loaded.
    weight_scale: nn.Parameter
    weight_zero: nn.Parameter
    input_scale: nn.Parameter
    input_perm: nn.Parameter | None
    input_scales: list[float]
    compute_dtype: torch.dtype
    quant_kernel: str
    fp8_w8a8: bool

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        layer_idx: int,
        name: str,
        dtype: torch.dtype,
        slice_names: Sequence[str] | None = None,
        slice_sizes: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.layer_idx = layer_idx
        self.slice_names: list[str] = list(slice_names) if slice_names is not None else [name]
        self.slice_sizes: list[int] = (
            list(slice_sizes) if slice_sizes is not None else [out_features]
        )
        if len(self.slice_names) != len(self.slice_sizes):
            raise ValueError("slice_names and slice_sizes must have the same length")
        if sum(self.slice_sizes) != out_features:
            raise ValueError(
                f"slice sizes {self.slice_sizes} do not sum to out_features={out_features}"
            )
        scheme = current_linear_scheme()
        self.quant_method: QuantMethod | None = (
            make_quant_method(scheme) if scheme is not None else None
        )
        if self.quant_method is None:
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        else:
            self.quant_method.create_weights(self, dtype)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        self.lora_delta: LoraDelta | None = None
        # The deterministic mode's batch-invariant projection (`batch_invariant.py` sets it),
        # and a quantized weight as its kernel reads it.
        self.fixed_order = False
        self.fixed_order_weight: FixedOrderWeight | None = None

    @property
    def sliced_params(self) -> tuple[str, ...]:
        """Local names of the tensors whose rows are split between the output slices."""
        names = ["weight", "weight_scale", "weight_zero", "input_scale", "bias"]
        return tuple(n for n in names if getattr(self, n, None) is not None)

    @property
    def shared_params(self) -> tuple[str, ...]:
        """Local names of the tensors every output slice loads whole and identical (the input
        order of an act-order quantized weight: the slices share the input)."""
        return tuple(n for n in ("input_perm",) if getattr(self, n, None) is not None)

    @property
    def slice_offsets(self) -> list[int]:
        """Start row of each output slice in the fused weight."""
        offsets, start = [], 0
        for size in self.slice_sizes:
            offsets.append(start)
            start += size
        return offsets

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Base projection, plus the LoRA delta when a runtime has hooked this module."""
        if self.fixed_order:
            w = self.weight if self.fixed_order_weight is None else self.fixed_order_weight
            y = fixed_order_linear(x, w, self.bias)
        elif self.quant_method is None:
            w = self.weight
            y = packed_linear(x, w, self.bias) if is_packed(w) else F.linear(x, w, self.bias)
        else:
            y = self.quant_method.apply(self, x)
        if self.lora_delta is not None:
            self.lora_delta(x, y, self)
        return y

    def load_slice(
        self,
        slice_name: str,
        tensor: torch.Tensor,
        *,
        is_bias: bool = False,
        piece: str | None = None,
    ) -> None:
        """Copy a HuggingFace weight (bias, weight_scale, weight_zero: `piece`) of one slice
        into its rows of the fused tensor."""
        piece = piece or ("bias" if is_bias else "weight")
        try:
            idx = self.slice_names.index(slice_name)
        except ValueError:
            raise KeyError(f"{slice_name!r} is not a slice of {self.slice_names}") from None
        if piece in self.shared_params:
            self._load_shared(slice_name, piece, tensor)
            return
        start, size = self.slice_offsets[idx], self.slice_sizes[idx]
        target = getattr(self, piece, None) if piece in self.sliced_params else None
        if target is None:
            raise KeyError(f"checkpoint has a {piece} for {slice_name!r} but the layer has none")
        expected = (size, *target.shape[1:])
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"{slice_name} {piece}: checkpoint shape {tuple(tensor.shape)} != expected "
                f"{expected}"
            )
        with torch.no_grad():
            target[start : start + size].copy_(tensor)

    def _load_shared(self, slice_name: str, piece: str, tensor: torch.Tensor) -> None:
        target = getattr(self, piece)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"{slice_name} {piece}: checkpoint shape {tuple(tensor.shape)} != expected "
                f"{tuple(target.shape)}"
            )
        if bool((target < 0).all()):
            with torch.no_grad():
                target.copy_(tensor)
        elif not torch.equal(target, tensor.to(target.device, target.dtype)):
            raise ValueError(
                f"{slice_name} {piece} differs from the other slices of {self.slice_names}: a "
                "fused layer serves one input order (GPTQ act-order g_idx of projections of the "
                "same input must match)"
            )

    def finish_loading(self) -> None:
        """Repack the weight for its kernel once every slice has loaded: quantized tensors for
        their method, a plain bf16 CPU weight for oneDNN."""
        if self.quant_method is not None:
            self.quant_method.finish_loading(self)
        elif can_pack(self.weight):
            self.weight = nn.Parameter(pack_weight(self.weight.data), requires_grad=False)

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, "
            f"layer={self.layer_idx}, slices={dict(zip(self.slice_names, self.slice_sizes, strict=True))}"
        )


class MergedLinear(Linear):
    """Several projections of the same input fused into one matmul (q/k/v, gate/up)."""

    def __init__(
        self,
        in_features: int,
        slice_sizes: Sequence[int],
        slice_names: Sequence[str],
        *,
        bias: bool,
        layer_idx: int,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(
            in_features,
            sum(slice_sizes),
            bias=bias,
            layer_idx=layer_idx,
            name="+".join(slice_names),
            dtype=dtype,
            slice_names=slice_names,
            slice_sizes=slice_sizes,
        )

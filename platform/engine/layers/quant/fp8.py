"""W8A8 fp8: e4m3 weights with one scale per output channel, activations quantized per token.

On a CUDA GPU with fp8 (compute capability 8.9+: Ada, Hopper) each step quantizes the
activations to e4m3 with a dynamic scale per token and multiplies fp8 x fp8 with
`torch._scaled_mm`. Everywhere else the weight is dequantized to the activation dtype for the
matmul (weight-only), CPU included: PyTorch's CPU `_scaled_mm` runs, but measured 1.4-3x
slower than converting the weight and calling the bf16 matmul (hidden 2048, batch 1 and 32;
`loraplex bench quant-kernels`). On CPU the codes are converted by bit arithmetic
(`fp8_codes_to`), about 10x faster than PyTorch's scalar fp8 conversion there.

Static activation scales (a compressed-tensors checkpoint calibrated per tensor,
`scheme.static_input`): each projection's input is quantized to e4m3 with its own
`input_scale` (`x -> fp8(clamp(x / s)) * s`, as the library's forward does) and multiplied by
the dequantized weight, on every device; a fused layer (q/k/v, gate/up) quantizes the shared
input once per projection. Compared with reading the same checkpoint weight-only, this adds the
activations' rounding to e4m3 and the clipping of inputs past 448 * s, which is what the
checkpoint was calibrated for (the tests measure the gap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.loader.quant.weight_only import FP8_MAX
from loraplex.platform.engine.layers.quant.base import add_bias, frozen

if TYPE_CHECKING:
    from loraplex.platform.engine.layers.linear import Linear


def scaled_mm_supported(device: torch.device) -> bool:
    """Whether `torch._scaled_mm` runs fp8 on `device` (CPU, or a CUDA GPU of compute 8.9+)."""
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return False


def use_scaled_mm(device: torch.device) -> bool:
    """Whether fp8 Linears on `device` run W8A8 `_scaled_mm` (CUDA fp8 GPUs only; on CPU the
    dequantizing path is faster)."""
    return device.type == "cuda" and scaled_mm_supported(device)


_SIGN_AND_EM = -30721  # int16 0x87FF: the sign bit and e4m3's 7 exponent+mantissa bits, shifted
_BIAS_GAP = 2.0**120  # bf16's exponent bias (127) minus e4m3's (7)


def fp8_codes_to(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 codes -> `dtype`, exactly (NaN codes aside). On CPU by bit arithmetic: an e4m3 byte
    shifted left 4 is a bf16 with the same sign, exponent and mantissa bits, worth 2^-120 of the
    value (subnormals included), so one multiply by 2^120 finishes it."""
    if q.device.type != "cpu":
        return q.to(dtype)
    bits = q.view(torch.int8).to(torch.int16)  # sign-extended: the sign lands in bit 15 below
    bits <<= 4
    bits &= _SIGN_AND_EM
    w = bits.view(torch.bfloat16).mul_(_BIAS_GAP)
    return w if dtype == torch.bfloat16 else w.to(dtype)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic e4m3 activations: (q [T, in], scale float32 [T, 1])."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp(min=1e-12)
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_static(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x through e4m3 with a static per-tensor scale and back, in x's dtype."""
    q = torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype)
    return (q.float() * scale).to(x.dtype)


def _static_input_linear(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """Each projection's input quantized with its own static scale, times its weight rows."""
    w = fp8_codes_to(layer.weight, x.dtype)
    parts = [
        F.linear(quantize_static(x, s), w[off : off + size])
        for s, off, size in zip(
            layer.input_scales, layer.slice_offsets, layer.slice_sizes, strict=True
        )
    ]
    y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    return y * layer.weight_scale.to(x.dtype)


class Fp8Method:
    """Per-channel fp8 e4m3 linear: W8A8 via `torch._scaled_mm` on fp8 GPUs, else weight-only."""

    def __init__(self, scheme: QuantScheme) -> None:
        self.scheme = scheme

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        layer.compute_dtype = dtype
        layer.weight = frozen(
            torch.empty(layer.out_features, layer.in_features, dtype=torch.float8_e4m3fn)
        )
        layer.weight_scale = frozen(torch.empty(layer.out_features, dtype=torch.float32))
        if self.scheme.static_input:  # one value per projection, repeated over its rows
            layer.input_scale = frozen(torch.empty(layer.out_features, dtype=torch.float32))

    def finish_loading(self, layer: Linear) -> None:
        layer.fp8_w8a8 = use_scaled_mm(layer.weight.device) and not self.scheme.static_input
        if self.scheme.static_input:
            layer.input_scales = [float(layer.input_scale[off]) for off in layer.slice_offsets]

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.scheme.static_input:
            y = _static_input_linear(layer, x2)
        elif getattr(layer, "fp8_w8a8", False):
            xq, x_scale = quantize_per_token(x2)
            y = torch._scaled_mm(
                xq,
                layer.weight.t(),
                scale_a=x_scale,
                scale_b=layer.weight_scale[None, :],
                out_dtype=x2.dtype,
            )
        else:  # weight-only: the per-channel scale applies to output columns after the matmul
            w = fp8_codes_to(layer.weight, x2.dtype)
            y = F.linear(x2, w) * layer.weight_scale.to(x2.dtype)
        return add_bias(y.reshape(*shape[:-1], layer.out_features), layer)

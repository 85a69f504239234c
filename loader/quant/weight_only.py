"""Quantizers of one linear weight [out, in] and the dequantizers that define their meaning.

int8: symmetric, one scale per output channel, codes in [-127, 127].
int4: one scale per (output channel, group of `group` inputs); codes 0..15 with `w = (q - z) * s`;
symmetric uses z = 8 for every group, asymmetric stores the integer zero point per group.
fp8 e4m3: one scale per output channel, `w = q.float() * s`.
"""

from __future__ import annotations

import torch

_TINY = torch.finfo(torch.float32).tiny
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def _check(weight: torch.Tensor) -> torch.Tensor:
    if weight.ndim != 2 or not weight.is_floating_point():
        raise ValueError(f"quantization needs a 2-D floating weight, got {tuple(weight.shape)}")
    return weight.float()


def quantize_int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: (q int8 [out, in], scale float32 [out])."""
    w = _check(weight)
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=_TINY)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scale per output channel, as `dtype`."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def quantize_int4_grouped(
    weight: torch.Tensor, group: int, *, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int4 per group of `group` inputs: (codes uint8 [out, in] in 0..15, scale float32
    [out, in/group], zero float32 [out, in/group], integer-valued)."""
    w = _check(weight)
    out, inp = w.shape
    if inp % group:
        raise ValueError(f"int4 needs in_features ({inp}) divisible by the group size {group}")
    wg = w.view(out, inp // group, group)
    if symmetric:
        # codes -8..7 around z=8; the scale maps the largest magnitude onto 8 (or 7) steps
        amax = wg.abs().amax(dim=-1)
        scale = (amax / 7.5).clamp(min=_TINY)
        zero = torch.full_like(scale, 8.0)
    else:
        lo = wg.amin(dim=-1).clamp(max=0.0)
        hi = wg.amax(dim=-1).clamp(min=0.0)
        scale = ((hi - lo) / 15.0).clamp(min=_TINY)
        zero = torch.round(-lo / scale).clamp_(0, 15)
    q = (torch.round(wg / scale[..., None]) + zero[..., None]).clamp_(0, 15)
    return q.view(out, inp).to(torch.uint8), scale, zero


def dequantize_int4(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """(q - zero) * scale per group, as `dtype` [out, in]."""
    out, inp = q.shape
    groups = scale.shape[1]
    qg = q.float().view(out, groups, inp // groups)
    return ((qg - zero.float()[..., None]) * scale.float()[..., None]).view(out, inp).to(dtype)


def quantize_fp8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 per output channel: (q float8_e4m3fn [out, in], scale float32 [out])."""
    w = _check(weight)
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=_TINY)
    q = (w / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scale per output channel, as `dtype`."""
    return (q.float() * scale.float()[:, None]).to(dtype)

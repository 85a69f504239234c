"""DeepSeek's decoupled RoPE: the rotary part of MLA's queries and keys, with YaRN scaling.

MLA rotates only `qk_rope_head_dim` dimensions of each head (and the one shared rotary key),
in interleaved pairs (DeepSeek-V2, and V3 with `rope_interleave`) or rotate-half halves.
YaRN (the scaling DeepSeek-V2/V3 checkpoints ship with) blends interpolated and extrapolated
frequencies, multiplies cos/sin by an attention factor, and, through `mscale_all_dim`, also
scales the softmax (`mla_softmax_scale`), all as transformers computes them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from loraplex.platform.engine.layers.rotary import compute_inv_freq


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction `0.1 * mscale * ln(scale) + 1` (1 when not stretched)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, params: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN inverse frequencies [dim // 2] and the cos/sin attention factor."""
    base = float(params["rope_theta"])
    original = float(params["original_max_position_embeddings"])
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_positions / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # the share of each frequency left unscaled
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def mla_softmax_scale(qk_head_dim: int, params: dict[str, Any]) -> float:
    """`qk_head_dim ** -0.5`, times `mscale(factor, mscale_all_dim) ** 2` under a scaled rope."""
    scale: float = qk_head_dim**-0.5
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        m = yarn_mscale(float(params["factor"]), float(params["mscale_all_dim"]))
        scale = scale * m * m
    return scale


class MLARotary(nn.Module):
    """(cos, sin) [T, rope_dim // 2] per position (already times the attention factor)."""

    def __init__(
        self, rope_dim: int, params: dict[str, Any], max_positions: int, interleaved: bool
    ) -> None:
        super().__init__()
        self.interleaved = interleaved
        if params.get("rope_type", "default") == "yarn":
            self.inv_freq, self.attention_factor = _yarn(rope_dim, params, max_positions)
        else:
            self.inv_freq, self.attention_factor = compute_inv_freq(rope_dim, params), 1.0

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Half-width cos and sin for each position, in the activations' dtype."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        f = self.attention_factor
        return (freqs.cos() * f).to(dtype), (freqs.sin() * f).to(dtype)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, heads, rope_dim]. Interleaved pairs come out as (evens, odds) halves:
        a fixed permutation shared by queries and keys, so their dot products are unchanged."""
        cos, sin = cos[:, None, :], sin[:, None, :]
        if self.interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
        else:
            half = x.shape[-1] // 2
            a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

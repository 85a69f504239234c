"""Attention over the paged KV cache.

Each step the layer writes the new tokens' K/V to their slots (`slot_mapping`), then attends
causally over the whole context through the block tables, both through its `AttentionBackend`
(`attention_backend`): chosen once, when `allocate_kv_cache` binds the layer's cache (Triton on
CUDA, the native in-place kernel over a CPU fp32/bf16 cache, the torch path otherwise).
"""

from __future__ import annotations

import torch
from torch import nn

from loraplex.platform.engine.forward_context import get_forward_context
from loraplex.platform.engine.layers.attention_backend import (
    AttentionBackend,
    choose_attention_backend,
)
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.paged_attention_torch import NO_SCALES, KVScales

__all__ = ["Attention", "AttentionBackend", "AttentionMetadata"]


class Attention(nn.Module):
    """Paged causal attention with GQA; `kv_cache` [2, num_blocks, block_size, Hkv, D] is bound
    by `allocate_kv_cache` before the first forward."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.layer_idx = layer_idx
        self.kv_cache: torch.Tensor | None = None
        self.kv_scales: KVScales = NO_SCALES  # dequantization scales of an fp8 cache
        # The deterministic mode: every query token alone, in one order (`batch_invariant.py`);
        # set before the cache is bound, it decides the backend with the cache.
        self.fixed_order = False
        self.backend: AttentionBackend | None = None  # chosen by `bind_cache`

    def bind_cache(self, kv_cache: torch.Tensor) -> None:
        """Bind the layer's cache and choose its backend for it (once, at engine build)."""
        self.kv_cache = kv_cache
        self.backend = choose_attention_backend(kv_cache, fixed_order=self.fixed_order)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq*D], k/v [T, Hkv*D] (rope applied) -> attention output [T, Hq*D]."""
        md = get_forward_context().attn
        if md is None:
            raise RuntimeError("the forward context carries no attention metadata")
        if self.kv_cache is None:
            raise RuntimeError(
                f"attention layer {self.layer_idx} has no KV cache: call allocate_kv_cache first"
            )
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        backend = self.backend
        if backend is None:
            raise RuntimeError(f"attention layer {self.layer_idx} has no backend: bind_cache first")
        backend.write_kv(self.kv_cache, k, v, md.slot_mapping, self.kv_scales)
        out = backend.attend(q, self.kv_cache, md, self.scale, self.kv_scales)
        return out.reshape(t, self.num_heads * self.head_dim)

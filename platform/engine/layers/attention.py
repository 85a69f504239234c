"""Attention over the paged KV cache.

Each step the layer writes the new tokens' K/V to their slots (`slot_mapping`), then attends
causally over the whole context through the block tables. Decode-only batches on CUDA use the
Triton kernels (no host sync, CUDA-graph capturable). On a CPU, decode rows over an fp32 or bf16
cache use the native kernel that reads the blocks in place (`paged_attention_cpu`) where it
builds; everything else uses the torch path.
"""

from __future__ import annotations

import torch
from torch import nn

from loraplex.platform.engine.forward_context import get_forward_context
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.fixed_order_attention import fixed_order_attention
from loraplex.platform.engine.layers.paged_attention_cpu import (
    native_decode_attention,
    native_decode_available,
    native_write_kv,
)
from loraplex.platform.engine.layers.paged_attention_torch import (
    NO_SCALES,
    KVScales,
    paged_attention_torch,
    write_kv_torch,
)
from loraplex.platform.engine.layers.paged_attention_triton import (
    decode_attention_triton,
    triton_available_for,
    write_kv_triton,
)

__all__ = ["Attention", "AttentionMetadata"]


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
        self.use_triton = True  # may be switched off to force the torch path on CUDA
        self.use_native = True  # may be switched off to force the torch path on a CPU
        # The deterministic mode: every query token alone, in one order (`batch_invariant.py`).
        self.fixed_order = False

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
        fast = self.use_triton and triton_available_for(q)
        sc = self.kv_scales
        if self.fixed_order:
            native_write_kv(self.kv_cache, k, v, md.slot_mapping)
            out = fixed_order_attention(q, self.kv_cache, md, self.scale)
        elif fast:
            write_kv_triton(self.kv_cache, k, v, md.slot_mapping, sc)
            out = paged_attention_torch(q, self.kv_cache, md, self.scale, _triton_decode, sc)
        elif self.use_native and native_decode_available(q, self.kv_cache):
            native_write_kv(self.kv_cache, k, v, md.slot_mapping)
            out = paged_attention_torch(q, self.kv_cache, md, self.scale, native_decode_attention)
        else:
            write_kv_torch(self.kv_cache, k, v, md.slot_mapping, sc)
            out = paged_attention_torch(q, self.kv_cache, md, self.scale, scales=sc)
        return out.reshape(t, self.num_heads * self.head_dim)


def _triton_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    scales: KVScales = NO_SCALES,
) -> torch.Tensor:
    """The Triton decode kernel behind the torch path's decode signature (no max needed)."""
    return decode_attention_triton(q, kv_cache, block_tables, seq_lens, scale, scales)

"""Allocate the paged KV cache and bind one tensor per attention layer."""

from __future__ import annotations

import math

import torch
from torch import nn

from loraplex.platform.engine.layers.attention import Attention


def attention_layers(model: nn.Module) -> list[Attention]:
    """The model's attention modules ordered by layer index."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    return sorted(layers, key=lambda a: a.layer_idx)


def kv_cache_torch_dtype(choice: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's storage dtype: the model's for `auto`, e4m3 for `fp8`."""
    if choice == "auto":
        return model_dtype
    if choice in ("fp8", "fp8_e4m3"):
        return torch.float8_e4m3fn
    raise ValueError(f"unknown KV cache dtype {choice!r}; expected auto or fp8")


def cache_shape(attn: Attention, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """A layer's cache tensor shape: its own (`cache_shape`: MLA's latent rows) or K and V
    [2, num_blocks, block_size, Hkv, D]."""
    own = getattr(attn, "cache_shape", None)
    if own is not None:
        return tuple(own(num_blocks, block_size))
    return (2, num_blocks, block_size, attn.num_kv_heads, attn.head_dim)


def kv_cache_bytes_per_block(model: nn.Module, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of `block_size` tokens takes across all layers (K and V)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(math.prod(cache_shape(a, 1, block_size)) * elem for a in attention_layers(model))


def num_blocks_for_budget(
    model: nn.Module, budget_bytes: int, block_size: int, dtype: torch.dtype
) -> int:
    """How many blocks fit in `budget_bytes`."""
    return max(0, int(budget_bytes) // kv_cache_bytes_per_block(model, block_size, dtype))


def allocate_kv_cache(
    model: nn.Module,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> list[torch.Tensor]:
    """Allocate `[2, num_blocks, block_size, Hkv, D]` per attention layer and bind it as
    `attn.kv_cache`, choosing the layer's attention backend for it (its KV scales moved beside
    it, one per KV head, before any CUDA graph is captured); returns the tensors in layer order."""
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError("num_blocks and block_size must be positive")
    caches = []
    for attn in attention_layers(model):
        cache = torch.zeros(cache_shape(attn, num_blocks, block_size), dtype=dtype, device=device)
        attn.bind_cache(cache)  # chooses the layer's attention backend for this cache
        attn.kv_scales = attn.kv_scales.per_head(attn.num_kv_heads, device)
        caches.append(cache)
    if not caches:
        raise ValueError("the model has no attention layers")
    return caches

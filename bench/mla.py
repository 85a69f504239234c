"""`loraplex bench mla`: what MLA's latent KV cache holds per token, against an expanded cache.

For the attention shapes of DeepSeek-V2-Lite and DeepSeek-V3 (their published config.json
values), the engine's own cache allocator sizes one layer of latent rows (`MLAAttention`,
`kv_cache_bytes_per_block` at block size 1, bf16); the baseline is the same layer's cache with
K and V expanded per head (`heads * (qk_nope + qk_rope + v_head_dim)` values), what an engine
that does not keep the latent would hold. Prints, per model:

- mla.<model>.kv_bytes_per_token_per_layer: the latent cache;
- mla.<model>.expanded_kv_bytes_per_token_per_layer: the expanded baseline;
- mla.<model>.expanded_over_latent: how many times more tokens the same memory holds.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from loraplex.platform.engine.kv_cache import kv_cache_bytes_per_block
from loraplex.platform.engine.layers.mla_attention import MLAAttention, expanded_bytes_per_token

SHAPES = {  # heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
    "deepseek_v2_lite": (16, 512, 64, 128, 128),
    "deepseek_v3": (128, 512, 64, 128, 128),
}


def main(argv: list[str]) -> int:
    """Print the RESULT lines (no timing: sizes the allocator computes)."""
    parser = argparse.ArgumentParser(prog="loraplex bench mla", description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    elem = torch.empty((), dtype=dtype).element_size()
    for name, (heads, rank, rope, nope, v) in SHAPES.items():
        layer = nn.ModuleList([MLAAttention(heads, rank, rope, 1.0, 0)])
        latent = kv_cache_bytes_per_block(layer, 1, dtype)
        expanded = expanded_bytes_per_token(heads, nope + rope, v, elem)
        print(f"RESULT mla.{name}.kv_bytes_per_token_per_layer={latent}")
        print(f"RESULT mla.{name}.expanded_kv_bytes_per_token_per_layer={expanded}")
        print(f"RESULT mla.{name}.expanded_over_latent={expanded / latent:.2f}")
    return 0

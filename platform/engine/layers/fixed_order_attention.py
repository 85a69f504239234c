"""Batch-invariant attention for the deterministic mode: every query token on its own.

A prompt token's attention normally goes through SDPA over its chunk, a decode token's through
the native decode kernel, and either's bits can change with the chunk boundaries or the batch.
Here each query token, prefill or decode, is one item of the native decode kernel
(`paged_attention_cpu`): its K/V rows read from the paged cache in position order through its
sequence's block table, up to its own position, in one fixed order. So a token's output is the
same whatever chunk, batch, or cached prefix it comes with.
"""

from __future__ import annotations

import torch

from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.paged_attention_cpu import native_decode_attention


def _per_token(md: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each token's block table row and its attended length (position + 1), built once a step."""
    cached: tuple[torch.Tensor, torch.Tensor, int] | None = md.cache.get("per_token")
    if cached is not None:
        return cached
    starts = md.query_start_loc.tolist()
    ctx = md.context_lens.tolist()
    seq_of: list[int] = []
    lens: list[int] = []
    for i in range(md.num_seqs):
        n = starts[i + 1] - starts[i]
        seq_of += [i] * n
        lens += range(ctx[i] + 1, ctx[i] + n + 1)
    tables = md.block_tables[torch.tensor(seq_of, dtype=torch.long)].contiguous()
    out = (tables, torch.tensor(lens, dtype=torch.int32), max(lens, default=1))
    md.cache["per_token"] = out
    return out


def fixed_order_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, scale: float
) -> torch.Tensor:
    """q [T, Hq, D] (K/V already written) -> out [T, Hq, D], each token attended alone."""
    tables, lens, max_len = _per_token(md)
    t = lens.shape[0]
    out = native_decode_attention(q[:t], kv_cache, tables, lens, max_len, scale)
    if q.shape[0] == t:
        return out
    full = torch.zeros_like(q)
    full[:t] = out
    return full

"""Multi-head latent attention (MLA) over a paged cache of the compressed latent.

Each token's cache row is its normalised KV latent `c` [kv_lora_rank] followed by its rotated
shared key `k_pe` [rope_dim]: one row for all heads, `kv_lora_rank + rope_dim` values instead
of `heads * (qk_head_dim + v_head_dim)` for the expanded K/V. Attention never expands it: the
up-projection is absorbed into the query and the output (`q_nope W_UK` scores against `c`, the
attended `c` goes through `W_UV`), which is exact algebra, so the block tables, prefix cache and
chunked prefill work on latent rows like on any other KV block. On CUDA the rows are stored
and decode-only steps attended by the Triton kernels (`mla_triton`); everything else runs the
torch path here. Which of the two (a `LatentAttentionBackend`) is chosen once, when the layer's
cache is bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from loraplex.platform.engine.forward_context import get_forward_context
from loraplex.platform.engine.layers.attention import Attention
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.mla_triton import (
    mla_decode_triton,
    mla_triton_available_for,
    write_latent_triton,
)
from loraplex.platform.engine.layers.paged_attention_torch import is_fp8_cache

FP8_LATENT_REFUSAL = (
    "an fp8 KV cache is not served with multi-head latent attention (MLA: DeepSeek-V2/V3) yet: "
    "the latent rows have no fp8 store or scaled read; use kv_cache_dtype auto"
)


class MLAAttention(Attention):
    """Paged attention over latent rows; `kv_cache` is [num_blocks, block_size, latent + rope]
    (`cache_shape`), bound by `allocate_kv_cache` like every attention layer's cache."""

    def __init__(
        self, num_heads: int, kv_lora_rank: int, rope_dim: int, scale: float, layer_idx: int
    ) -> None:
        super().__init__(num_heads, 1, kv_lora_rank + rope_dim, scale, layer_idx)
        self.kv_lora_rank = kv_lora_rank
        self.rope_dim = rope_dim
        self.latent_backend: LatentAttentionBackend | None = None  # chosen by `bind_cache`

    def bind_cache(self, kv_cache: torch.Tensor) -> None:
        """Bind the layer's latent cache and choose its backend for it (once); an fp8 cache is
        refused here, when the engine allocates it, not at the first request."""
        if is_fp8_cache(kv_cache):
            raise NotImplementedError(FP8_LATENT_REFUSAL)
        self.kv_cache = kv_cache
        self.latent_backend = choose_latent_backend(kv_cache)

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """One latent row per token (the KV cache allocator asks each layer for its shape)."""
        return (num_blocks, block_size, self.kv_lora_rank + self.rope_dim)

    def forward_latent(
        self,
        q_lat: torch.Tensor,
        q_pe: torch.Tensor,
        latent: torch.Tensor,
        k_pe: torch.Tensor,
    ) -> torch.Tensor:
        """q_lat [T, H, C] (q_nope through W_UK), q_pe [T, H, R], this step's latent [T, C] and
        rotated k_pe [T, R] -> attended latent [T, H, C] (to go through W_UV)."""
        md = get_forward_context().attn
        if md is None:
            raise RuntimeError("the forward context carries no attention metadata")
        cache = self.kv_cache
        if cache is None:
            raise RuntimeError(
                f"attention layer {self.layer_idx} has no KV cache: call allocate_kv_cache first"
            )
        if self.fixed_order:
            raise NotImplementedError("the deterministic mode does not cover MLA attention yet")
        if is_fp8_cache(cache):
            raise NotImplementedError(FP8_LATENT_REFUSAL)
        rows = torch.cat((latent, k_pe), dim=-1)
        q = torch.cat((q_lat, q_pe), dim=-1)
        backend = self.latent_backend
        if backend is None:
            raise RuntimeError(f"attention layer {self.layer_idx} has no backend: bind_cache first")
        backend.write_latent(cache, rows, md.slot_mapping)
        return backend.attend(q, cache, md, self.scale, self.kv_lora_rank)


@runtime_checkable
class LatentAttentionBackend(Protocol):
    """Writes a step's latent rows into an MLA layer's paged cache and attends over them."""

    name: str

    def write_latent(self, cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Store rows [T, C+R] at their slots of cache [N, bs, C+R] (slot -1 skipped)."""
        ...

    def attend(
        self, q: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata, scale: float, c: int
    ) -> torch.Tensor:
        """q [T, H, C+R] (rows written) -> attended latent [T, H, C]."""
        ...


class LatentTorchAttention:
    """The torch path: any device and dtype."""

    name = "torch"

    def write_latent(self, cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Store rows [T, C+R] at their slots (slot -1 skipped)."""
        write_latent(cache, rows, slots)

    def attend(
        self, q: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata, scale: float, c: int
    ) -> torch.Tensor:
        """q [T, H, C+R] of a mixed batch -> attended latent [T, H, C]."""
        return latent_attention(q, cache, md, scale, c)


class LatentTritonAttention:
    """CUDA: the Triton row store, decode-only steps through the Triton kernel (no host
    sync), mixed steps through the torch path."""

    name = "triton"

    def write_latent(self, cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Store rows [T, C+R] at their slots (slot -1 skipped)."""
        write_latent_triton(cache, rows, slots)

    def attend(
        self, q: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata, scale: float, c: int
    ) -> torch.Tensor:
        """q [T, H, C+R] of a mixed batch -> attended latent [T, H, C]."""
        if not md.is_decode_only:
            return latent_attention(q, cache, md, scale, c)
        s = md.num_seqs
        out = mla_decode_triton(q[:s], cache, md.block_tables, md.seq_lens, scale, c)
        pad = q.shape[0] - s
        return torch.cat((out, out.new_zeros(pad, *out.shape[1:]))) if pad else out


def choose_latent_backend(cache: torch.Tensor) -> LatentAttentionBackend:
    """The backend for an MLA layer bound to `cache` (called once, when it is bound)."""
    return LatentTritonAttention() if mla_triton_available_for(cache) else LatentTorchAttention()


if TYPE_CHECKING:  # mypy checks both implementations against the Protocol
    _BACKENDS: tuple[LatentAttentionBackend, ...] = (
        LatentTorchAttention(),
        LatentTritonAttention(),
    )


def write_latent(cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store rows [T, C + R] at their slots of cache [N, bs, C + R]; slot -1 is skipped."""
    flat = cache.view(-1, cache.shape[-1])
    valid = slot_mapping >= 0
    flat[slot_mapping[valid]] = rows[valid].to(cache.dtype)


def _gather(cache: torch.Tensor, tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """Latent rows [S, num_blocks * bs, C + R] of each sequence, through its block table."""
    s = tables.shape[0]
    ids = tables[:, :num_blocks].reshape(-1).long()
    return cache.index_select(0, ids).view(s, num_blocks * cache.shape[1], cache.shape[2])


def _attend(
    q: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, scale: float, c: int
) -> torch.Tensor:
    """q [B, H, n, C+R] over rows [B, L, C+R] (keys: the whole row; values: its latent part)."""
    k = rows[:, None].to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, k[..., :c], attn_mask=mask, scale=scale, enable_gqa=q.shape[1] > 1
    )


def _decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
    c: int,
) -> torch.Tensor:
    """One query token per sequence: q [S, H, C+R] -> [S, H, C]; no host sync."""
    rows = _gather(cache, tables, max(1, -(-max_len // cache.shape[1])))
    key_pos = torch.arange(rows.shape[1], device=q.device)
    mask = key_pos[None, :] < seq_lens[:, None].to(key_pos.dtype)  # [S, L]
    return _attend(q[:, :, None, :], rows, mask[:, None, None, :], scale, c)[:, :, 0, :]


def _plan(md: AttentionMetadata) -> tuple[list[int], list[int], list[int], list[int]]:
    """Host copies of the batch layout, read once per step and shared by every layer."""
    plan = md.cache.get("mla_plan")
    if plan is None:
        starts = md.query_start_loc.tolist()
        ctx, lens = md.context_lens.tolist(), md.seq_lens.tolist()
        decodes = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
        plan = md.cache["mla_plan"] = (starts, ctx, lens, decodes)
    return plan


def latent_attention(
    q: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata, scale: float, c: int
) -> torch.Tensor:
    """q [T, H, C+R] of a mixed batch (rows already written) -> attended latent [T, H, C].

    Decode rows (one query token) run as one batched masked attention (a decode-only step
    reads nothing back to the host); prefill chunks one sequence at a time with the causal
    mask offset by what the cache held before the step.
    """
    if md.is_decode_only:
        s = md.num_seqs
        out = _decode(q[:s], cache, md.block_tables, md.seq_lens, md.max_seq_len, scale, c)
        if q.shape[0] == s:
            return out
        return torch.cat((out, out.new_zeros(q.shape[0] - s, *out.shape[1:])))
    out = q.new_zeros(q.shape[0], q.shape[1], c)
    starts, ctx, lens, decodes = _plan(md)
    if decodes:
        seq_idx = torch.tensor(decodes, dtype=torch.long, device=q.device)
        tok_idx = torch.tensor([starts[i] for i in decodes], dtype=torch.long, device=q.device)
        max_len = max(lens[i] for i in decodes)
        tables, seq_lens = md.block_tables[seq_idx], md.seq_lens[seq_idx]
        out[tok_idx] = _decode(q[tok_idx], cache, tables, seq_lens, max_len, scale, c)
    bs = cache.shape[1]
    for i in range(len(lens)):
        a, b = starts[i], starts[i + 1]
        if b - a <= 1:
            continue
        rows = _gather(cache, md.block_tables[i : i + 1], -(-lens[i] // bs))[:, : lens[i]]
        q_pos = torch.arange(b - a, device=q.device) + ctx[i]
        mask = torch.arange(lens[i], device=q.device)[None, :] <= q_pos[:, None]  # [n, L]
        qp = q[a:b].transpose(0, 1)[None]  # [1, H, n, C+R]
        out[a:b] = _attend(qp, rows, mask, scale, c)[0].transpose(0, 1)
    return out


def latent_bytes_per_token(kv_lora_rank: int, rope_dim: int, element_size: int) -> int:
    """Cache bytes one token takes in one MLA layer (the latent row)."""
    return (kv_lora_rank + rope_dim) * element_size


def expanded_bytes_per_token(
    num_heads: int, qk_head_dim: int, v_head_dim: int, element_size: int
) -> int:
    """Cache bytes one token would take in one layer with K and V expanded per head."""
    return num_heads * (qk_head_dim + v_head_dim) * element_size

"""Torch reference path of paged attention: write new K/V by slot, attend through block tables.

Runs on CPU (and on GPU when Triton is unavailable). Decodes are batched: K/V of all decoding
sequences are gathered through their block tables and one masked batched attention runs. Prefill
chunks loop over sequences (one SDPA call each, with the causal mask offset by the context).

An fp8 (e4m3) cache stores `k / k_scale` and `v / v_scale` (`KVScales`: one scale per layer,
or one per KV head) and every read multiplies back: the same block layout in half the bytes of
a bf16 cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata

FP8_KV_DTYPES = (torch.float8_e4m3fn,)
_FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


Scale = float | torch.Tensor
"""A per-tensor scale (float) or one per KV head (float32 tensor [Hkv])."""


@dataclass(frozen=True)
class KVScales:
    """Dequantization scales of one layer's fp8 KV cache, per tensor or per KV head (unused by
    a float cache)."""

    k: Scale = 1.0
    v: Scale = 1.0

    def per_head(self, num_kv_heads: int, device: torch.device | str) -> KVScales:
        """The same scales as float32 [Hkv] tensors on `device` (what the kernels read)."""

        def expand(x: Scale) -> torch.Tensor:
            t = torch.as_tensor(x, dtype=torch.float32).reshape(-1).to(device)
            if t.numel() not in (1, num_kv_heads):
                raise ValueError(f"a KV scale has {t.numel()} values for {num_kv_heads} KV heads")
            return t.expand(num_kv_heads).contiguous()

        return KVScales(expand(self.k), expand(self.v))


NO_SCALES = KVScales()


def _heads(scale: Scale) -> Scale:
    """A per-head scale shaped to broadcast over [..., Hkv, D]."""
    return scale[:, None] if isinstance(scale, torch.Tensor) else scale


def is_fp8_cache(kv_cache: torch.Tensor) -> bool:
    """Whether the cache stores e4m3 codes (reads must multiply by the layer's scales)."""
    return kv_cache.dtype in FP8_KV_DTYPES


def to_cache(x: torch.Tensor, dtype: torch.dtype, scale: Scale) -> torch.Tensor:
    """x [..., Hkv, D] in the cache's dtype: fp8 codes of x / scale (saturated), or a cast."""
    if dtype in FP8_KV_DTYPES:
        return (x.float() / _heads(scale)).clamp_(-_FP8_MAX, _FP8_MAX).to(dtype)
    return x.to(dtype)


def from_cache(x: torch.Tensor, dtype: torch.dtype, scale: Scale) -> torch.Tensor:
    """Cache contents [..., Hkv, D] as `dtype`: fp8 codes times their scale, or a cast."""
    if x.dtype in FP8_KV_DTYPES:
        return (x.float() * _heads(scale)).to(dtype)
    return x.to(dtype)


def write_kv_torch(
    kv_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    scales: KVScales = NO_SCALES,
) -> None:
    """Store k, v [T, Hkv, D] at their slots of kv_cache [2, N, bs, Hkv, D]; slot -1 is skipped."""
    num_kv_heads, head_dim = kv_cache.shape[-2], kv_cache.shape[-1]
    k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)
    v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_flat[slots] = to_cache(k[valid], kv_cache.dtype, scales.k)
    v_flat[slots] = to_cache(v[valid], kv_cache.dtype, scales.v)


def gather_kv(
    kv_cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [S, num_blocks * bs, Hkv, D] of each sequence, read through its block table."""
    bt = block_tables[:, :num_blocks].reshape(-1).long()
    s = block_tables.shape[0]
    _, _, bs, hkv, d = kv_cache.shape
    # index_select on the block axis copies whole blocks (faster than advanced indexing)
    k = kv_cache[0].index_select(0, bt).view(s, num_blocks * bs, hkv, d)
    v = kv_cache[1].index_select(0, bt).view(s, num_blocks * bs, hkv, d)
    return k, v


def decode_attention_torch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    scales: KVScales = NO_SCALES,
) -> torch.Tensor:
    """One query token per sequence: q [S, Hq, D] -> out [S, Hq, D]; no host sync.

    The gathered K/V are handed to SDPA as strided [S, Hkv, L, D] views (no transpose copy),
    with a per-sequence length mask; math in fp32 like the reference softmax, except bf16 on
    CPU: its SDPA kernel accumulates in fp32 itself, and upcasting would copy every gathered
    K/V block a second time each step.
    """
    s, hq, d = q.shape
    bs, hkv = kv_cache.shape[2], kv_cache.shape[3]
    num_blocks = max(1, -(-max_seq_len // bs))
    k, v = gather_kv(kv_cache, block_tables, num_blocks)
    key_pos = torch.arange(num_blocks * bs, device=q.device)
    mask = key_pos[None, :] < seq_lens[:, None].to(key_pos.dtype)
    ct = q.dtype if q.dtype == torch.bfloat16 and q.device.type == "cpu" else torch.float32
    out = F.scaled_dot_product_attention(
        q.to(ct)[:, :, None, :],
        from_cache(k, ct, scales.k).transpose(1, 2),
        from_cache(v, ct, scales.v).transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=hq != hkv,
    )
    return out[:, :, 0, :].to(q.dtype)


def prefill_attention_torch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_len: int,
    seq_len: int,
    scale: float,
    scales: KVScales = NO_SCALES,
) -> torch.Tensor:
    """One sequence's chunk q [n, Hq, D] at positions context_len.. over its cached context.

    Batched 4-D inputs let SDPA pick its fused (flash) CPU kernel, which never holds the
    [n, L] scores; 3-D ones fell to the math path (a 1,500-token prompt's attention cost
    2.5x as much). A whole prompt is plainly causal (the kernel skips the masked blocks); a
    later chunk's causal mask is offset by its context, so it is given explicitly.
    """
    n, hq, d = q.shape
    bs, hkv = kv_cache.shape[2], kv_cache.shape[3]
    num_blocks = -(-seq_len // bs)
    k, v = gather_kv(kv_cache, block_table[None, :], num_blocks)
    k = from_cache(k[:, :seq_len], q.dtype, scales.k).transpose(1, 2)  # [1, Hkv, L, D]
    v = from_cache(v[:, :seq_len], q.dtype, scales.v).transpose(1, 2)
    mask = None
    if seq_len != n:  # keys before the chunk: the causal mask is offset
        q_pos = torch.arange(n, device=q.device) + context_len
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]  # [n, L]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k,
        v,
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=hq != hkv,
    )
    return out[0].transpose(0, 1)


@dataclass
class _BatchPlan:
    """How a mixed batch splits into batched decodes and per-sequence prefill chunks."""

    decode_seq_idx: torch.Tensor | None  # [Sd] sequences with one query token
    decode_tok_idx: torch.Tensor | None  # [Sd] their token rows
    decode_max_len: int
    prefills: list[tuple[int, int, int, int, int]]  # (seq, start, end, context_len, seq_len)


def _plan(md: AttentionMetadata, device: torch.device) -> _BatchPlan:
    """Host-side split of the batch, computed once per step and shared by every layer."""
    plan = md.cache.get("torch_plan")
    if isinstance(plan, _BatchPlan):
        return plan
    starts = md.query_start_loc.tolist()
    ctx = md.context_lens.tolist()
    lens = md.seq_lens.tolist()
    decodes = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
    plan = _BatchPlan(
        decode_seq_idx=torch.tensor(decodes, device=device, dtype=torch.long) if decodes else None,
        decode_tok_idx=(
            torch.tensor([starts[i] for i in decodes], device=device, dtype=torch.long)
            if decodes
            else None
        ),
        decode_max_len=max((lens[i] for i in decodes), default=0),
        prefills=[
            (i, starts[i], starts[i + 1], ctx[i], lens[i])
            for i in range(len(lens))
            if starts[i + 1] - starts[i] > 1
        ],
    )
    md.cache["torch_plan"] = plan
    return plan


DecodeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float, KVScales], torch.Tensor
]


def paged_attention_torch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
    decode_fn: DecodeFn = decode_attention_torch,
    scales: KVScales = NO_SCALES,
) -> torch.Tensor:
    """Attention for a mixed batch q [T, Hq, D] (K/V already written) -> out [T, Hq, D].

    `decode_fn(q, kv_cache, block_tables, seq_lens, max_seq_len, scale, scales)` serves the rows with
    a single query token (the Triton kernel on GPU, the batched torch gather otherwise).
    """
    if md.is_decode_only:
        s = md.num_seqs
        out = decode_fn(
            q[:s], kv_cache, md.block_tables, md.seq_lens, md.max_seq_len, scale, scales
        )
        if q.shape[0] == s:
            return out
        full = torch.zeros_like(q)
        full[:s] = out
        return full
    plan = _plan(md, q.device)
    out = torch.zeros_like(q)
    if plan.decode_seq_idx is not None and plan.decode_tok_idx is not None:
        out[plan.decode_tok_idx] = decode_fn(
            q[plan.decode_tok_idx],
            kv_cache,
            md.block_tables[plan.decode_seq_idx],
            md.seq_lens[plan.decode_seq_idx],
            plan.decode_max_len,
            scale,
            scales,
        )
    for i, a, b, ctx_len, seq_len in plan.prefills:
        out[a:b] = prefill_attention_torch(
            q[a:b], kv_cache, md.block_tables[i], ctx_len, seq_len, scale, scales
        )
    return out


class TorchAttention:
    """The torch path as an `AttentionBackend`: any device, any cache dtype (fp8 included)."""

    name = "torch"

    def write_kv(
        self,
        kv_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
        scales: KVScales,
    ) -> None:
        """Store k, v [T, Hkv, D] at their slots (slot -1 skipped)."""
        write_kv_torch(kv_cache, k, v, slot_mapping, scales)

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
        scales: KVScales,
    ) -> torch.Tensor:
        """q [T, Hq, D] of a mixed batch (K/V written) -> out [T, Hq, D]."""
        return paged_attention_torch(q, kv_cache, md, scale, scales=scales)

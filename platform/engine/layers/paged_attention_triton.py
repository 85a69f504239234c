"""Triton kernels for the paged KV cache: store new K/V by slot, and decode attention.

The decode kernel handles one query token per sequence; a program owns one (sequence, query
head) pair, walks the sequence's block table block by block and keeps an online softmax, so it
never materialises the gathered context. GQA maps query head h to KV head h // group. Both
kernels take their sizes from device tensors only, so they are CUDA-graph capturable. On CPU
they run under `TRITON_INTERPRET=1` (tests only). An fp8 cache stores `k / k_scale` (and v)
in e4m3 (rounded by torch before the store kernel copies the codes) and the decode kernel
multiplies the scale of each KV head back in registers.
"""

from __future__ import annotations

import torch

from loraplex.loader.tensor_layout import require_contiguous, require_stride1_last
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.paged_attention_torch import (
    NO_SCALES,
    KVScales,
    is_fp8_cache,
    paged_attention_torch,
    to_cache,
)

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is a Linux test/GPU dependency
    HAS_TRITON = False


def triton_available_for(t: torch.Tensor) -> bool:
    """True when the Triton kernels can run on t's device (CUDA with triton installed)."""
    return HAS_TRITON and t.is_cuda


if HAS_TRITON:

    @triton.jit
    def _store_kv_kernel(
        k_ptr,
        v_ptr,
        k_cache_ptr,
        v_cache_ptr,
        slot_ptr,
        stride_k_tok,
        stride_v_tok,
        ROW: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        tok = tl.program_id(0)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        # broadcast the slot explicitly: a scalar-bool mask trips the CPU interpreter
        mask = (offs < ROW) & ((tl.zeros([BLOCK], dtype=tl.int64) + slot) >= 0)
        k = tl.load(k_ptr + tok * stride_k_tok + offs, mask=mask)
        v = tl.load(v_ptr + tok * stride_v_tok + offs, mask=mask)
        dst = slot * ROW + offs
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _paged_decode_kernel(
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr,
        seq_lens_ptr,
        out_ptr,
        scale,
        k_scale_ptr,
        v_scale_ptr,
        stride_q_seq,
        stride_q_head,
        stride_c_block,
        stride_c_tok,
        stride_c_head,
        stride_bt_seq,
        stride_o_seq,
        stride_o_head,
        GROUP: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_T: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        seq_len = tl.load(seq_lens_ptr + seq)
        k_scale = tl.load(k_scale_ptr + kv_head)
        v_scale = tl.load(v_scale_ptr + kv_head)
        offs_d = tl.arange(0, BLOCK_D)
        offs_t = tl.arange(0, BLOCK_T)
        d_mask = offs_d < HEAD_DIM
        q = tl.load(
            q_ptr + seq * stride_q_seq + head * stride_q_head + offs_d, mask=d_mask, other=0.0
        ).to(tl.float32)
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        num_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
        for j in range(0, num_blocks):
            block = tl.load(block_tables_ptr + seq * stride_bt_seq + j).to(tl.int64)
            pos = j * BLOCK_SIZE + offs_t
            t_mask = (offs_t < BLOCK_SIZE) & (pos < seq_len)
            base = block * stride_c_block + kv_head * stride_c_head
            ptrs = base + offs_t[:, None] * stride_c_tok + offs_d[None, :]
            kv_mask = t_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + ptrs, mask=kv_mask, other=0.0).to(tl.float32) * k_scale
            v = tl.load(v_cache_ptr + ptrs, mask=kv_mask, other=0.0).to(tl.float32) * v_scale
            scores = tl.sum(k * q[None, :], axis=1) * scale
            scores = tl.where(t_mask, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=0))
            p = tl.exp(scores - m_new)
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m_i = m_new
        out = acc / tl.maximum(l_i, 1e-30)
        tl.store(
            out_ptr + seq * stride_o_seq + head * stride_o_head + offs_d,
            out.to(out_ptr.dtype.element_ty),
            mask=d_mask,
        )


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; use the torch paged-attention path")


def write_kv_triton(
    kv_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    scales: KVScales = NO_SCALES,
) -> None:
    """Store k, v [T, Hkv, D] at their slots of kv_cache [2, N, bs, Hkv, D]; slot -1 is skipped."""
    _require_triton()
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    if not kv_cache.is_contiguous():
        raise ValueError("the KV cache must be contiguous")
    if is_fp8_cache(kv_cache):  # round to e4m3 with torch's (RNE, saturating) conversion
        k, v = to_cache(k, kv_cache.dtype, scales.k), to_cache(v, kv_cache.dtype, scales.v)
    k2 = k.reshape(num_tokens, -1)
    v2 = v.reshape(num_tokens, -1)
    if k2.stride(1) != 1 or v2.stride(1) != 1:
        k2, v2 = k2.contiguous(), v2.contiguous()
    row = k2.shape[1]
    _store_kv_kernel[(num_tokens,)](
        k2,
        v2,
        kv_cache[0],
        kv_cache[1],
        slot_mapping,
        k2.stride(0),
        v2.stride(0),
        ROW=row,
        BLOCK=triton.next_power_of_2(row),
    )


def decode_attention_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    scales: KVScales = NO_SCALES,
) -> torch.Tensor:
    """Paged decode attention: q [S, Hq, D] (one token per sequence) -> out [S, Hq, D]."""
    _require_triton()
    s, hq, d = q.shape
    _, _, block_size, hkv, d_cache = kv_cache.shape
    if d_cache != d or hq % hkv != 0:
        raise ValueError(f"q heads/dim ({hq}, {d}) do not fit the cache ({hkv}, {d_cache})")
    if q.stride(2) != 1:
        q = q.contiguous()
    require_contiguous("decode_attention_triton", kv_cache=kv_cache)
    require_stride1_last("decode_attention_triton", block_tables=block_tables)
    require_contiguous("decode_attention_triton", seq_lens=seq_lens)
    out = torch.empty(s, hq, d, dtype=q.dtype, device=q.device)
    if s == 0:
        return out
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    per_head = scales.per_head(hkv, q.device)  # no copy when already [Hkv] on the device
    _paged_decode_kernel[(s, hq)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        scale,
        per_head.k,
        per_head.v,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=hq // hkv,
        BLOCK_SIZE=block_size,
        BLOCK_T=triton.next_power_of_2(block_size),
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
    )
    return out


def _decode_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    scales: KVScales = NO_SCALES,
) -> torch.Tensor:
    """The decode kernel behind the torch path's decode signature (it needs no max length)."""
    return decode_attention_triton(q, kv_cache, block_tables, seq_lens, scale, scales)


class TritonAttention:
    """The CUDA `AttentionBackend`: the Triton store, decode rows through the Triton kernel
    (no host sync, graph-capturable), prefill chunks through the torch path."""

    name = "triton"

    def write_kv(
        self,
        kv_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
        scales: KVScales,
    ) -> None:
        """Store k, v [T, Hkv, D] at their slots (slot -1 skipped)."""
        write_kv_triton(kv_cache, k, v, slot_mapping, scales)

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
        scales: KVScales,
    ) -> torch.Tensor:
        """q [T, Hq, D] of a mixed batch (K/V written) -> out [T, Hq, D]."""
        return paged_attention_torch(q, kv_cache, md, scale, _decode_triton, scales)

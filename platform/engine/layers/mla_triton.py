"""Triton kernels for MLA's paged latent cache: store latent rows by slot, and decode attention.

The decode kernel takes one query token per sequence; a program owns one (sequence, head) pair,
walks the sequence's block table with an online softmax, scores each cached row (latent and
rotary key together) against the absorbed query, and accumulates the rows' latent part: the
attended latent [S, H, kv_lora_rank] the caller projects through W_UV. Sizes come from device
tensors only (CUDA-graph capturable). On a CPU they run under `TRITON_INTERPRET=1` (tests).
"""

from __future__ import annotations

import torch

from loraplex.loader.tensor_layout import require_contiguous, require_stride1_last

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is a Linux test/GPU dependency
    HAS_TRITON = False


if HAS_TRITON:

    @triton.jit
    def _store_latent_kernel(rows_ptr, cache_ptr, slot_ptr, stride_r, ROW: tl.constexpr,
                             BLOCK: tl.constexpr):  # fmt: skip
        tok = tl.program_id(0)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = (offs < ROW) & ((tl.zeros([BLOCK], dtype=tl.int64) + slot) >= 0)
        row = tl.load(rows_ptr + tok * stride_r + offs, mask=mask)
        tl.store(cache_ptr + slot * ROW + offs, row.to(cache_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _mla_decode_kernel(
        q_ptr,
        cache_ptr,
        block_tables_ptr,
        seq_lens_ptr,
        out_ptr,
        scale,
        stride_q_seq,
        stride_q_head,
        stride_c_block,
        stride_c_tok,
        stride_bt_seq,
        stride_o_seq,
        stride_o_head,
        LATENT: tl.constexpr,
        ROW: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        seq_len = tl.load(seq_lens_ptr + seq)
        offs_d = tl.arange(0, BLOCK_D)
        offs_t = tl.arange(0, BLOCK_T)
        d_mask = offs_d < ROW
        v_mask = offs_d < LATENT
        q = tl.load(
            q_ptr + seq * stride_q_seq + head * stride_q_head + offs_d, mask=d_mask, other=0.0
        ).to(tl.float32)
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for j in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
            block = tl.load(block_tables_ptr + seq * stride_bt_seq + j).to(tl.int64)
            pos = j * BLOCK_SIZE + offs_t
            t_mask = (offs_t < BLOCK_SIZE) & (pos < seq_len)
            ptrs = block * stride_c_block + offs_t[:, None] * stride_c_tok + offs_d[None, :]
            rows = tl.load(cache_ptr + ptrs, mask=t_mask[:, None] & d_mask[None, :], other=0.0).to(
                tl.float32
            )
            scores = tl.sum(rows * q[None, :], axis=1) * scale
            scores = tl.where(t_mask, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=0))
            p = tl.exp(scores - m_new)
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * rows, axis=0)  # past LATENT: not stored
            m_i = m_new
        out = acc / tl.maximum(l_i, 1e-30)
        tl.store(
            out_ptr + seq * stride_o_seq + head * stride_o_head + offs_d,
            out.to(out_ptr.dtype.element_ty),
            mask=v_mask,
        )


def mla_triton_available_for(t: torch.Tensor) -> bool:
    """True when the kernels can run on t's device (CUDA with triton installed)."""
    return HAS_TRITON and t.is_cuda


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; use the torch MLA path")


def write_latent_triton(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """Store rows [T, C + R] at their slots of cache [N, bs, C + R]; slot -1 is skipped."""
    _require_triton()
    require_contiguous("write_latent_triton", cache=cache)
    if rows.shape[0] == 0:
        return
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    row = cache.shape[-1]
    _store_latent_kernel[(rows.shape[0],)](
        rows, cache, slots, rows.stride(0), ROW=row, BLOCK=triton.next_power_of_2(row)
    )


def mla_decode_triton(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    latent: int,
) -> torch.Tensor:
    """q [S, H, C+R] (one token per sequence) over cache [N, bs, C+R] -> [S, H, C]."""
    _require_triton()
    s, h, d = q.shape
    if cache.shape[-1] != d or not 0 < latent <= d:
        raise ValueError(f"query rows of {d} do not fit cache rows of {cache.shape[-1]}")
    if q.stride(2) != 1:
        q = q.contiguous()
    require_contiguous("mla_decode_triton", cache=cache, seq_lens=seq_lens)
    require_stride1_last("mla_decode_triton", block_tables=block_tables)
    out = torch.empty(s, h, latent, dtype=q.dtype, device=q.device)
    if s == 0:
        return out
    block_size = cache.shape[1]
    _mla_decode_kernel[(s, h)](
        q, cache, block_tables, seq_lens, out, scale,
        q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1),
        LATENT=latent, ROW=d, BLOCK_SIZE=block_size,
        BLOCK_T=triton.next_power_of_2(block_size), BLOCK_D=triton.next_power_of_2(d),
    )  # fmt: skip
    return out

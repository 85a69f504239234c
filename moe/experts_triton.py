"""Grouped-GEMM MoE kernels in Triton (the GPU path).

Pairs are aligned by `align_block_size`: each M-block of BLOCK_M padded rows belongs to one
expert. Kernel 1 computes gate and up tiles for a block from the expert's `w13` and writes
SiLU(gate) * up; kernel 2 multiplies that by the expert's `w2`, scales each row by its routed
weight and writes per-pair rows, summed over k afterwards. Blocks of experts held on another
rank (expert id -1) write zeros. Tested on CPU under TRITON_INTERPRET=1 against
`experts_torch`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.moe.align import align_block_size
from loraplex.moe.experts_torch import _check_weights


@triton.jit
def _gate_up_silu_kernel(
    x_ptr, w13_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr,
    num_pairs, hidden, inter, top_k,
    stride_xm, stride_we, stride_wn, stride_wk, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], zeros, mask=col_ok[None, :])
        return
    pair = tl.load(sorted_ids_ptr + rows)
    row_ok = pair < num_pairs
    token = pair // top_k
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = w13_ptr + expert * stride_we
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        a = tl.load(
            x_ptr + token[:, None] * stride_xm + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w_mask = k_ok[:, None] & col_ok[None, :]
        wg = tl.load(
            w_base + cols[None, :] * stride_wn + ks[:, None] * stride_wk, mask=w_mask, other=0.0
        )
        wu = tl.load(
            w_base + (cols[None, :] + inter) * stride_wn + ks[:, None] * stride_wk,
            mask=w_mask,
            other=0.0,
        )
        acc_gate += tl.dot(a, wg)
        acc_up += tl.dot(a, wu)
    act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        act.to(out_ptr.dtype.element_ty),
        mask=col_ok[None, :],
    )


@triton.jit
def _down_kernel(
    act_ptr, w2_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr,
    num_pairs, hidden, inter,
    stride_am, stride_we, stride_wn, stride_wk, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    pair = tl.load(sorted_ids_ptr + rows)
    row_ok = pair < num_pairs
    out_mask = row_ok[:, None] & col_ok[None, :]
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
        tl.store(out_ptr + pair[:, None] * stride_om + cols[None, :], zeros, mask=out_mask)
        return
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = w2_ptr + expert * stride_we
    for k0 in range(0, inter, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < inter
        a = tl.load(
            act_ptr + rows[:, None] * stride_am + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_base + cols[None, :] * stride_wn + ks[:, None] * stride_wk,
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        acc += tl.dot(a, w)
    routed = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * routed[:, None]
    tl.store(
        out_ptr + pair[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=out_mask,
    )


def _tiles(num_pairs: int, on_gpu: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): small M tiles for decode-sized batches."""
    if not on_gpu:
        return 16, 32, 32
    return (16 if num_pairs <= 64 else 64), 64, 64


def fused_experts_triton(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `fused_experts_torch`: [T, H] = sum_k w * Expert(x), grouped GEMMs."""
    _check_weights(hidden, w13, w2)
    num_tokens, top_k = topk_ids.shape
    num_local, two_inter, hsize = w13.shape
    inter = two_inter // 2
    num_experts = int(expert_map.numel()) if expert_map is not None else num_local
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return hidden.new_zeros(hidden.shape)
    block_m, block_n, block_k = _tiles(num_pairs, hidden.is_cuda)
    aligned = align_block_size(topk_ids, num_experts, block_m, expert_map)
    num_blocks = aligned.block_expert_ids.numel()
    x = hidden.contiguous()
    act = hidden.new_empty((aligned.num_padded, inter))
    _gate_up_silu_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w13, act, aligned.sorted_pair_ids, aligned.block_expert_ids,
        num_pairs, hsize, inter, top_k,
        x.stride(0), w13.stride(0), w13.stride(1), w13.stride(2), act.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    pair_out = torch.zeros((num_pairs, hsize), dtype=torch.float32, device=hidden.device)
    _down_kernel[(num_blocks, triton.cdiv(hsize, block_n))](
        act, w2, pair_out, aligned.sorted_pair_ids, aligned.block_expert_ids, weights,
        num_pairs, hsize, inter,
        act.stride(0), w2.stride(0), w2.stride(1), w2.stride(2), pair_out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return pair_out.view(num_tokens, top_k, hsize).sum(dim=1).to(hidden.dtype)

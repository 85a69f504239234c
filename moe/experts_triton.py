"""Grouped-GEMM MoE kernels in Triton (the GPU path).

Pairs are aligned by `align_block_size`: each M-block of BLOCK_M padded rows belongs to one
expert. Kernel 1 computes gate and up tiles for a block from the expert's `w13` and writes
SiLU(gate) * up; kernel 2 multiplies that by the expert's `w2`, scales each row by its routed
weight and writes per-pair rows, summed over k afterwards. Blocks of experts held on another
rank (expert id -1) write zeros. Tested on CPU under TRITON_INTERPRET=1 against
`experts_torch`.

Quantized experts (`QuantizedExperts`, constexpr QUANT): int8 and fp8 codes are cast exactly
to the activation dtype for the dot and the per-row scale multiplies the fp32 accumulator;
int4 codes (two a byte along K) are unpacked and dequantized in registers with their group's
(scale, zero) before the dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.moe.align import align_block_size
from loraplex.moe.experts_torch import ExpertWeights, check_expert_weights
from loraplex.moe.packed_experts import PackedExperts
from loraplex.moe.quant_experts import QuantizedExperts

_QUANT = {"int8": 1, "int4": 2, "fp8": 3}


@triton.jit
def _weight_tile(
    w_base, s_base, n_idx, ks, mask, stride_wn, stride_wk, stride_sn, stride_sg,
    QUANT: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """Tile [BLOCK_K, BLOCK_N] of W^T (rows n_idx, inputs ks): float weights as stored; int4
    dequantized to fp32 here; int8 / fp8 codes as fp32 values (their scales are applied after
    the dot)."""
    if QUANT == 2:
        packed = tl.load(
            w_base + n_idx[None, :] * stride_wn + (ks[:, None] // 2) * stride_wk,
            mask=mask,
            other=0,
        )
        q = (packed >> ((ks[:, None] % 2) * 4).to(tl.uint8)) & 0xF
        sz = s_base + (ks[:, None] // GROUP) * stride_sg + n_idx[None, :] * stride_sn
        scale = tl.load(sz, mask=mask, other=0.0).to(tl.float32)
        zero = tl.load(sz + 1, mask=mask, other=0.0).to(tl.float32)
        return (q.to(tl.float32) - 8.0) * scale + zero
    else:
        ptrs = w_base + n_idx[None, :] * stride_wn + ks[:, None] * stride_wk
        if QUANT == 0:
            return tl.load(ptrs, mask=mask, other=0.0)
        # codes through fp32 (exact; the interpreter mis-casts int8 -> bf16), zero off the mask
        return tl.where(mask, tl.load(ptrs, mask=mask).to(tl.float32), 0.0)


@triton.jit
def _row_scale(s_base, n_idx, mask, stride_sn, QUANT: tl.constexpr):
    """Per-row scale [BLOCK_N] of int8 / fp8 codes (1 otherwise)."""
    if QUANT == 1 or QUANT == 3:
        return tl.load(s_base + n_idx * stride_sn, mask=mask, other=0.0).to(tl.float32)
    else:
        return tl.full(n_idx.shape, 1.0, tl.float32)


@triton.jit
def _gate_up_silu_kernel(
    x_ptr, w13_ptr, s13_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr,
    num_pairs, hidden, inter, top_k,
    stride_xm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sg, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    QUANT: tl.constexpr, GROUP: tl.constexpr,
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
    s_base = s13_ptr + expert * stride_se
    a_ty = x_ptr.dtype.element_ty
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        a = tl.load(
            x_ptr + token[:, None] * stride_xm + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w_mask = k_ok[:, None] & col_ok[None, :]
        wg = _weight_tile(
            w_base, s_base, cols, ks, w_mask, stride_wn, stride_wk, stride_sn, stride_sg,
            QUANT, GROUP,
        )  # fmt: skip
        wu = _weight_tile(
            w_base, s_base, cols + inter, ks, w_mask, stride_wn, stride_wk, stride_sn,
            stride_sg, QUANT, GROUP,
        )  # fmt: skip
        acc_gate += tl.dot(a, wg.to(a_ty))
        acc_up += tl.dot(a, wu.to(a_ty))
    acc_gate *= _row_scale(s_base, cols, col_ok, stride_sn, QUANT)[None, :]
    acc_up *= _row_scale(s_base, cols + inter, col_ok, stride_sn, QUANT)[None, :]
    act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        act.to(out_ptr.dtype.element_ty),
        mask=col_ok[None, :],
    )


@triton.jit
def _down_kernel(
    act_ptr, w2_ptr, s2_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr,
    num_pairs, hidden, inter,
    stride_am, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sg, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    QUANT: tl.constexpr, GROUP: tl.constexpr,
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
    s_base = s2_ptr + expert * stride_se
    a_ty = act_ptr.dtype.element_ty
    for k0 in range(0, inter, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < inter
        a = tl.load(
            act_ptr + rows[:, None] * stride_am + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = _weight_tile(
            w_base, s_base, cols, ks, k_ok[:, None] & col_ok[None, :], stride_wn, stride_wk,
            stride_sn, stride_sg, QUANT, GROUP,
        )  # fmt: skip
        acc += tl.dot(a, w.to(a_ty))
    acc *= _row_scale(s_base, cols, col_ok, stride_sn, QUANT)[None, :]
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


def _operand(w: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int], int, int]:
    """(codes or weights, scales, (stride_se, stride_sn, stride_sg), QUANT, GROUP) for a kernel."""
    if isinstance(w, PackedExperts):  # oneDNN's layout exists on a CPU only
        raise ValueError("oneDNN-packed experts run on the torch path, not the Triton kernels")
    if not isinstance(w, QuantizedExperts):
        return w, w, (0, 0, 0), 0, 1
    if w.cpu_int4:
        raise ValueError("int4 experts packed for PyTorch's CPU kernel run on the torch path")
    s = w.scale
    if w.kind == "int4":  # [E, G, N, 2], (scale, zero) adjacent
        if s.stride(3) != 1:
            raise ValueError("int4 expert scales must be contiguous in their last dim")
        return w.codes, s, (s.stride(0), s.stride(2), s.stride(1)), _QUANT["int4"], w.group
    return w.codes, s, (s.stride(0), s.stride(1), 0), _QUANT[w.kind], 1


def fused_experts_triton(
    hidden: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `fused_experts_torch`: [T, H] = sum_k w * Expert(x), grouped GEMMs;
    `w13` / `w2` may be `QuantizedExperts` (int4 in the nibble layout)."""
    check_expert_weights(hidden, w13, w2)
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
    c13, s13, st13, quant, group = _operand(w13)
    c2, s2, st2, quant2, group2 = _operand(w2)
    if (quant, group) != (quant2, group2):
        raise ValueError("w13 and w2 must be stored the same way")
    _gate_up_silu_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, c13, s13, act, aligned.sorted_pair_ids, aligned.block_expert_ids,
        num_pairs, hsize, inter, top_k,
        x.stride(0), c13.stride(0), c13.stride(1), c13.stride(2), *st13, act.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, QUANT=quant, GROUP=group,
    )  # fmt: skip
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    pair_out = torch.zeros((num_pairs, hsize), dtype=torch.float32, device=hidden.device)
    _down_kernel[(num_blocks, triton.cdiv(hsize, block_n))](
        act, c2, s2, pair_out, aligned.sorted_pair_ids, aligned.block_expert_ids, weights,
        num_pairs, hsize, inter,
        act.stride(0), c2.stride(0), c2.stride(1), c2.stride(2), *st2, pair_out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, QUANT=quant, GROUP=group,
    )  # fmt: skip
    return pair_out.view(num_tokens, top_k, hsize).sum(dim=1).to(hidden.dtype)

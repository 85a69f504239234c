"""Expert LoRA inside the Triton grouped MoE kernels (the GPU path of `expert_lora.py`).

The same block layout as `experts_triton.py` (each M-block of aligned pair rows belongs to one
expert); every row also carries its token's adapter slot. While kernel 1 walks the hidden dim
for gate/up it accumulates the shrink `x A_e^T` of each row with its own adapter's A (one
masked dot per adapter slot: rows of other adapters contribute zeros), then adds the expand
`shrink B_e^T` to the gate and up accumulators before SiLU; kernel 2 does the same for down
before the routed weight. Ranks are zero-padded to a power of two of at least 16 (what tl.dot
and tl.arange need), adapters to the step's slot count. Float experts only: quantized stacks with expert LoRA run the torch path.
Tested on CPU under TRITON_INTERPRET=1 against `fused_experts_lora_torch`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.moe.align import align_block_size
from loraplex.moe.expert_lora import ExpertLoraBatch
from loraplex.moe.experts_torch import check_expert_weights

MIN_RANK_PAD = 16


@triton.jit
def _lora_gate_up_kernel(
    x_ptr, w_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, slot_ptr, a_ptr, b_ptr,
    num_pairs, hidden, inter, top_k,
    stride_xm, stride_we, stride_wn, stride_om, stride_as, stride_ae, stride_bs, stride_be,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SLOTS: tl.constexpr, RANK: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ranks = tl.arange(0, RANK)
    col_ok = cols < inter
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], zeros, mask=col_ok[None, :])
        return
    pair = tl.load(sorted_ids_ptr + rows)
    row_ok = pair < num_pairs
    token = pair // top_k
    slot = tl.load(slot_ptr + token, mask=row_ok, other=-1)
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    shrink = tl.zeros((BLOCK_M, RANK), dtype=tl.float32)
    w_base = w_ptr + expert * stride_we
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
        wg = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=w_mask, other=0.0)
        wu = tl.load(
            w_base + (cols + inter)[None, :] * stride_wn + ks[:, None], mask=w_mask, other=0.0
        )
        acc_gate += tl.dot(a, wg.to(a_ty))
        acc_up += tl.dot(a, wu.to(a_ty))
        for s in tl.static_range(SLOTS):  # each row's shrink with its own adapter's A
            la = tl.load(
                a_ptr + s * stride_as + expert * stride_ae + ranks[None, :] * hidden + ks[:, None],
                mask=k_ok[:, None], other=0.0,
            )  # fmt: skip
            mine = tl.where((slot == s)[:, None], a, 0.0).to(a_ty)
            shrink += tl.dot(mine, la.to(a_ty))
    two_inter = 2 * inter
    for s in tl.static_range(SLOTS):
        mine = tl.where((slot == s)[:, None], shrink, 0.0).to(a_ty)
        b_base = b_ptr + s * stride_bs + expert * stride_be
        bg = tl.load(
            b_base + cols[None, :] * RANK + ranks[:, None], mask=col_ok[None, :], other=0.0
        )
        bu = tl.load(
            b_base + (cols + inter)[None, :] * RANK + ranks[:, None],
            mask=col_ok[None, :] & ((cols + inter) < two_inter)[None, :],
            other=0.0,
        )
        acc_gate += tl.dot(mine, bg.to(a_ty))
        acc_up += tl.dot(mine, bu.to(a_ty))
    act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        act.to(out_ptr.dtype.element_ty),
        mask=col_ok[None, :],
    )


@triton.jit
def _lora_down_kernel(
    act_ptr, w_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, slot_ptr, a_ptr,
    b_ptr, num_pairs, hidden, inter, top_k,
    stride_am, stride_we, stride_wn, stride_om, stride_as, stride_ae, stride_bs, stride_be,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SLOTS: tl.constexpr, RANK: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ranks = tl.arange(0, RANK)
    col_ok = cols < hidden
    pair = tl.load(sorted_ids_ptr + rows)
    row_ok = pair < num_pairs
    out_mask = row_ok[:, None] & col_ok[None, :]
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
        tl.store(out_ptr + pair[:, None] * stride_om + cols[None, :], zeros, mask=out_mask)
        return
    slot = tl.load(slot_ptr + pair // top_k, mask=row_ok, other=-1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    shrink = tl.zeros((BLOCK_M, RANK), dtype=tl.float32)
    w_base = w_ptr + expert * stride_we
    a_ty = act_ptr.dtype.element_ty
    for k0 in range(0, inter, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < inter
        a = tl.load(
            act_ptr + rows[:, None] * stride_am + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_base + cols[None, :] * stride_wn + ks[:, None],
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        acc += tl.dot(a, w.to(a_ty))
        for s in tl.static_range(SLOTS):
            la = tl.load(
                a_ptr + s * stride_as + expert * stride_ae + ranks[None, :] * inter + ks[:, None],
                mask=k_ok[:, None], other=0.0,
            )  # fmt: skip
            mine = tl.where((slot == s)[:, None], a, 0.0).to(a_ty)
            shrink += tl.dot(mine, la.to(a_ty))
    for s in tl.static_range(SLOTS):
        mine = tl.where((slot == s)[:, None], shrink, 0.0).to(a_ty)
        b_base = b_ptr + s * stride_bs + expert * stride_be
        b = tl.load(b_base + cols[None, :] * RANK + ranks[:, None], mask=col_ok[None, :], other=0.0)
        acc += tl.dot(mine, b.to(a_ty))
    routed = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * routed[:, None]
    tl.store(
        out_ptr + pair[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=out_mask,
    )


def rank_pad(lora: ExpertLoraBatch) -> int:
    """The padded rank of the step's expert factors: a power of two, at least 16."""
    ranks = [
        getattr(w, part).shape[1]
        for w in lora.slots
        if w is not None
        for part in ("w13_a", "w2_a")
        if getattr(w, part) is not None
    ]
    padded: int = triton.next_power_of_2(max(ranks, default=1))  # triton ships no types
    return max(MIN_RANK_PAD, padded)


def _stacked(
    lora: ExpertLoraBatch, part: str, local: int, n: int, k: int, pad: int, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [S, L, pad, k], B [S, L, n, pad]) of every slot, zeros where absent."""
    slots = max(len(lora.slots), 1)
    a = like.new_zeros((slots, local, pad, k))
    b = like.new_zeros((slots, local, n, pad))
    for s, w in enumerate(lora.slots):
        fa = None if w is None else getattr(w, f"{part}_a")
        if fa is None:
            continue
        r = fa.shape[1]
        a[s, :, :r] = fa
        b[s, :, :, :r] = getattr(w, f"{part}_b")
    return a, b


def fused_experts_lora_triton(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    lora: ExpertLoraBatch,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fused_experts_lora_torch`'s contract on the Triton grouped kernels (float experts)."""
    check_expert_weights(hidden, w13, w2)
    if not isinstance(w13, torch.Tensor) or not isinstance(w2, torch.Tensor):
        raise ValueError("the Triton expert-LoRA kernels take float expert stacks")
    num_tokens, top_k = topk_ids.shape
    num_local, two_inter, hsize = w13.shape
    inter = two_inter // 2
    num_experts = int(expert_map.numel()) if expert_map is not None else num_local
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return hidden.new_zeros(hidden.shape)
    block_m, block_n, block_k = (16, 32, 32) if not hidden.is_cuda else (16, 64, 64)
    aligned = align_block_size(topk_ids, num_experts, block_m, expert_map)
    num_blocks = aligned.block_expert_ids.numel()
    x, w13, w2 = hidden.contiguous(), w13.contiguous(), w2.contiguous()
    slot = lora.token_slot.to(torch.int32).contiguous()
    pad = rank_pad(lora)
    a13, b13 = _stacked(lora, "w13", num_local, two_inter, hsize, pad, x)
    a2, b2 = _stacked(lora, "w2", num_local, hsize, inter, pad, x)
    slots = a13.shape[0]
    act = hidden.new_empty((aligned.num_padded, inter))
    _lora_gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w13, act, aligned.sorted_pair_ids, aligned.block_expert_ids, slot, a13, b13,
        num_pairs, hsize, inter, top_k,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        a13.stride(0), a13.stride(1), b13.stride(0), b13.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SLOTS=slots, RANK=pad,
    )  # fmt: skip
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    pair_out = torch.zeros((num_pairs, hsize), dtype=torch.float32, device=hidden.device)
    _lora_down_kernel[(num_blocks, triton.cdiv(hsize, block_n))](
        act, w2, pair_out, aligned.sorted_pair_ids, aligned.block_expert_ids, weights, slot,
        a2, b2, num_pairs, hsize, inter, top_k,
        act.stride(0), w2.stride(0), w2.stride(1), pair_out.stride(0),
        a2.stride(0), a2.stride(1), b2.stride(0), b2.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SLOTS=slots, RANK=pad,
    )  # fmt: skip
    return pair_out.view(num_tokens, top_k, hsize).sum(dim=1).to(hidden.dtype)

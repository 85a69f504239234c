"""CPU grouped expert path and token-expert alignment against a plain per-pair reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.moe import experts_torch
from loraplex.moe.align import align_block_size, sort_pairs_by_expert
from loraplex.moe.experts_torch import expert_rows_torch, fused_experts_torch
from loraplex.moe.packed_experts import PackedExperts, can_pack_experts
from loraplex.moe.quant_experts import QuantizedExperts, quantize_rows


def _reference(x, w13, w2, weights, ids, expert_map=None):
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if expert_map is not None:
                e = int(expert_map[e])
                if e < 0:
                    continue
            gu = w13[e] @ x[t]
            out[t] += weights[t, j] * (w2[e] @ (F.silu(gu[:inter]) * gu[inter:]))
    return out


def _problem(tokens=13, experts=6, k=2, hidden=16, inter=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.3
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=g)
    return x, w13, w2, weights, ids


def test_fused_experts_torch_matches_reference() -> None:
    x, w13, w2, weights, ids = _problem()
    torch.testing.assert_close(
        fused_experts_torch(x, w13, w2, weights, ids),
        _reference(x, w13, w2, weights, ids),
        atol=1e-5,
        rtol=1e-5,
    )


def test_fused_experts_torch_with_expert_map_skips_remote_experts() -> None:
    x, w13, w2, weights, ids = _problem()
    # This rank holds experts 4 and 1 (in slots 0 and 1).
    emap = torch.tensor([-1, 1, -1, -1, 0, -1])
    local_w13, local_w2 = w13[[4, 1]], w2[[4, 1]]
    got = fused_experts_torch(x, local_w13, local_w2, weights, ids, expert_map=emap)
    want = _reference(x, local_w13, local_w2, weights, ids, expert_map=emap)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.abs().sum() > 0


def test_expert_rows_keeps_row_order() -> None:
    x, w13, w2, _, _ = _problem()
    slots = torch.tensor([3, 0, 3, 5, 1, 1, 2, 0, 4, 4, 5, 2, 3])
    got = expert_rows_torch(x, slots, w13, w2)
    want = _reference(x, w13, w2, torch.ones(13, 1), slots[:, None])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_align_block_size_pads_each_expert_run() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])  # pairs 0..5 -> experts 2,0,2,1,0,2
    aligned = align_block_size(ids, num_experts=4, block_m=4)
    pad = 6
    # expert 0: pairs 1,4; expert 1: pair 3; expert 2: pairs 0,2,5; expert 3: none.
    # Sized for the worst case (6 pairs + 4 experts * 3 padding -> 20 rows, 5 blocks).
    assert aligned.num_padded == 20
    assert (
        aligned.sorted_pair_ids.tolist()
        == [1, 4, pad, pad, 3, pad, pad, pad, 0, 2, 5, pad] + [pad] * 8
    )
    assert aligned.block_expert_ids.tolist() == [0, 1, 2, -1, -1]
    remote = align_block_size(ids, 4, 4, expert_map=torch.tensor([-1, 0, -1, 1]))
    assert remote.block_expert_ids.tolist() == [-1, 0, -1, -1, -1]


def test_align_block_size_random_is_a_permutation() -> None:
    _, _, _, _, ids = _problem(tokens=50, experts=8, k=3)
    aligned = align_block_size(ids, 8, block_m=16)
    assert aligned.num_padded % 16 == 0
    real = aligned.sorted_pair_ids[aligned.sorted_pair_ids < aligned.num_pairs]
    assert sorted(real.tolist()) == list(range(150))
    flat = ids.reshape(-1)
    for b, e in enumerate(aligned.block_expert_ids.tolist()):
        block = aligned.sorted_pair_ids[b * 16 : (b + 1) * 16]
        block = block[block < aligned.num_pairs]
        assert (flat[block] == e).all()
    assert sort_pairs_by_expert(ids, 8).counts == torch.bincount(flat, minlength=8).tolist()


@pytest.mark.parametrize("copy_bytes", [0, 1 << 40], ids=["per_expert", "sorted_copy"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_both_combine_paths_match_reference_with_remote_experts(
    monkeypatch: pytest.MonkeyPatch, copy_bytes: int, packed: bool
) -> None:
    """Prefill's per-expert gathers and decode's one sorted copy: same sums, remote skipped."""
    if packed and not can_pack_experts(torch.empty(1, 1, 1)):
        pytest.skip("no oneDNN fp32 packing on this build")
    monkeypatch.setattr(experts_torch, "SORTED_COPY_BYTES", copy_bytes)
    x, w13, w2, weights, ids = _problem(tokens=40, experts=6, k=3)
    emap = torch.tensor([2, 1, -1, 3, 0, -1])  # experts 2 and 5 held on another rank
    local = [4, 1, 0, 3]
    l13, l2 = w13[local], w2[local]
    s13, s2 = (PackedExperts(l13), PackedExperts(l2)) if packed else (l13, l2)
    got = fused_experts_torch(x, s13, s2, weights, ids, expert_map=emap)
    want = _reference(x, l13, l2, weights, ids, expert_map=emap)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(experts_torch, "SORTED_COPY_BYTES", (1 << 40) - copy_bytes)
    assert torch.equal(fused_experts_torch(x, s13, s2, weights, ids, expert_map=emap), got)


def test_weighted_pair_sum_rounds_bf16_once() -> None:
    """Each token's top-k rows are summed in fp32 and rounded once: eight 2**-9 steps on top of
    1.0 reach 1 + 2**-6 (bf16 adds one expert at a time would stay at 1.0: each step is under
    half an ulp)."""
    top_k = 9
    rows = torch.tensor([[1.0]] + [[2.0**-9]] * (top_k - 1)).to(torch.bfloat16)
    order = torch.arange(top_k)  # sorted row i holds pair (0, i)
    got = experts_torch.weighted_pair_sum(rows, order, torch.ones(1, top_k))
    assert got.dtype == torch.bfloat16
    assert got.item() == 1.0 + 2.0**-6


def test_weighted_pair_sum_follows_the_sort_order() -> None:
    """Sorted row i belongs to pair order[i] = t * top_k + k, weighted by weight[t, k]."""
    g = torch.Generator().manual_seed(3)
    tokens, top_k, hidden = 5, 3, 4
    pair_rows = torch.randn(tokens * top_k, hidden, generator=g)  # row of pair t * top_k + k
    weights = torch.rand(tokens, top_k, generator=g)
    order = torch.randperm(tokens * top_k, generator=g)
    got = experts_torch.weighted_pair_sum(pair_rows[order], order, weights)
    want = (pair_rows.view(tokens, top_k, hidden) * weights[..., None]).sum(1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["plain", "packed", "quantized"])
def test_bound_expert_mm_matches_expert_mm_into_out(kind: str) -> None:
    """The loop's bound matmul gives `expert_mm`'s product, returned or written into `out`."""
    if kind == "packed" and not can_pack_experts(torch.empty(1, 1, 1)):
        pytest.skip("no oneDNN fp32 packing on this build")
    _, w13, _, _, _ = _problem()
    stack = {
        "plain": lambda: w13,
        "packed": lambda: PackedExperts(w13),
        "quantized": lambda: QuantizedExperts(
            "int8", *quantize_rows("int8", w13, 0, True, w13.dtype)
        ),
    }[kind]()
    x = torch.randn(5, w13.shape[2], generator=torch.Generator().manual_seed(1))
    mm = experts_torch.bind_expert_mm(stack, x.dtype)
    want = experts_torch.expert_mm(x, stack, 3)
    torch.testing.assert_close(mm(x, 3, None), want, atol=1e-6, rtol=1e-6)
    out = torch.full((7, w13.shape[1]), float("nan"))
    got = mm(x, 3, out[2:])
    assert got.data_ptr() == out[2:].data_ptr()
    torch.testing.assert_close(out[2:], want, atol=1e-6, rtol=1e-6)
    assert out[:2].isnan().all()

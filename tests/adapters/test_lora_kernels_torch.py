"""The CPU batched LoRA paths (torch, and the native kernel) against a per-token oracle built
from each adapter's own A and B."""

from __future__ import annotations

import shutil

import pytest
import torch
from support.lora_reference import llama_specs, random_adapter, reference_delta

from loraplex.adapters.device_pool import DevicePool
from loraplex.adapters.kernels import lora_packed
from loraplex.adapters.kernels.lora_cpu import lora_delta_native, native_lora_available
from loraplex.adapters.kernels.lora_packed import (
    PackCache,
    lora_compute_dtype,
    lora_delta_packed,
    pack_linear,
)
from loraplex.adapters.kernels.lora_sgmv import build_sgmv_plan, lora_delta_sgmv
from loraplex.adapters.kernels.lora_torch import lora_delta_torch
from loraplex.adapters.metadata import build_lora_meta

RANK_SETS = [
    {"q_proj": 4, "v_proj": 4},
    {
        "q_proj": 8,
        "k_proj": 8,
        "v_proj": 8,
        "o_proj": 8,
        "gate_proj": 8,
        "up_proj": 8,
        "down_proj": 8,
    },
    {"q_proj": 64, "down_proj": 16},
    {"k_proj": 16, "up_proj": 32},
    {"o_proj": 12, "gate_proj": 5},
    {"q_proj": 32, "k_proj": 7, "v_proj": 20, "down_proj": 64},
]


def setup_pool(dtype=torch.float32):
    specs = llama_specs()
    pool = DevicePool(specs, capacity_bytes=10_000_000, max_lora_rank=64, dtype=dtype)
    adapters = [random_adapter(f"k{i}", r, seed=i, dtype=dtype) for i, r in enumerate(RANK_SETS)]
    residents = [pool.load(a) for a in adapters]
    return specs, pool, adapters, residents


# (adapter index or None, num tokens) in batch order: prefill chunks, decodes, base tokens,
# one adapter split over several runs.
LAYOUTS = [
    [(0, 5), (None, 3), (1, 1), (2, 7), (0, 1), (3, 1), (None, 1), (4, 4), (5, 2), (1, 3)],
    [(i % 6, 1) for i in range(13)] + [(None, 1)],
    [(None, 4)],
    [(2, 9)],
    [(None, 3), (0, 2), (1, 2), (2, 2), (None, 1)],  # one run after base rows: no gather
]


def lora_delta_gathered(x, y, a_buf, b_buf, meta, lid, offsets, sizes):
    """The gathered SGMV path as the runtime drives it (one plan per step, shared)."""
    if not meta.groups:
        return
    if meta.sgmv_plan is None:
        meta.sgmv_plan = build_sgmv_plan(meta, a_buf.shape[0], x.dtype)
    lora_delta_sgmv(x, y, a_buf, b_buf, meta.sgmv_plan, lid, offsets, sizes)


def lora_delta_packed_step(x, y, a_buf, b_buf, meta, lid, offsets, sizes):
    """The packed path as the runtime drives it (plan in the LoRA compute dtype, packed once)."""
    if not meta.groups:
        return
    dtype = lora_compute_dtype(x)
    if meta.sgmv_plan is None:
        meta.sgmv_plan = build_sgmv_plan(meta, a_buf.shape[0], dtype)
    packed = pack_linear(a_buf, b_buf, meta.sgmv_plan, lid, offsets, sizes, dtype)
    lora_delta_packed(x, y, packed, meta.sgmv_plan)


def lora_delta_packed_per_slice(x, y, a_buf, b_buf, meta, lid, offsets, sizes):
    """The packed path with B packed per slice (what many chunks of wide outputs get)."""
    saved = lora_packed.BLOCK_DIAGONAL_MAX_BYTES
    lora_packed.BLOCK_DIAGONAL_MAX_BYTES = 0
    try:
        lora_delta_packed_step(x, y, a_buf, b_buf, meta, lid, offsets, sizes)
    finally:
        lora_packed.BLOCK_DIAGONAL_MAX_BYTES = saved


def slice_bounds(offsets, sizes):
    """A Linear's slice offsets and sizes as the int32 tensors the hooks hand the kernel."""
    return torch.tensor(offsets, dtype=torch.int32), torch.tensor(sizes, dtype=torch.int32)


def lora_delta_native_step(x, y, a_buf, b_buf, meta, lid, offsets, sizes):
    """The native CPU kernel as the hooks call it (must build here: a C compiler is present)."""
    assert native_lora_available(x, a_buf, meta.max_rank)
    lora_delta_native(x, y, a_buf, b_buf, meta, lid, slice_bounds(offsets, sizes))


NO_CC = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine"
)
PATHS = [
    lora_delta_torch,
    lora_delta_gathered,
    lora_delta_packed_step,
    lora_delta_packed_per_slice,
    pytest.param(lora_delta_native_step, marks=NO_CC),
]
PATH_IDS = ["loop", "sgmv", "packed", "packed_per_slice", "native"]


@pytest.mark.parametrize("fn", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_torch_path_matches_oracle(layout, fn):
    specs, pool, adapters, residents = setup_pool()
    seqs = [(None if i is None else residents[i], n) for i, n in LAYOUTS[layout]]
    per_token = [None if i is None else adapters[i] for i, n in LAYOUTS[layout] for _ in range(n)]
    meta = build_lora_meta(
        seqs, max_loras=8, num_linears=len(specs), max_slices=3, num_tokens=len(per_token) + 2
    )
    per_token += [None, None]  # padding tokens
    torch.manual_seed(1)
    for lid, spec in enumerate(specs):
        x = torch.randn(len(per_token), spec.in_features)
        base = torch.randn(len(per_token), spec.out_features)
        y = base.clone()
        fn(x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes)
        want = base.double() + reference_delta(x, per_token, spec)
        torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)


def test_metadata_groups_tokens_by_slot():
    specs, pool, adapters, residents = setup_pool()
    seqs = [(residents[1], 2), (None, 1), (residents[0], 1), (residents[1], 1)]
    meta = build_lora_meta(seqs, max_loras=4, num_linears=len(specs), max_slices=3)
    assert meta.token_slot.tolist() == [0, 0, -1, 1, 0]
    assert meta.sorted_token_ids.tolist() == [0, 1, 4, 3, 2]
    assert meta.active_slots.tolist() == [0, 1, -1, -1]
    assert meta.slot_num_tokens.tolist() == [3, 1, 0, 0]
    assert meta.slot_start.tolist() == [0, 3, 0, 0]
    assert meta.slot_row_start.tolist()[:2] == [residents[1].row_start, residents[0].row_start]
    assert meta.max_rank == 8
    # q/k/v of adapter 0 (rank 4 on q and v only) in slot 1 of the first linear (layer 0 qkv)
    assert meta.ranks[0, :, 1].tolist() == [4, 0, 4]
    with pytest.raises(ValueError, match="max_loras"):
        build_lora_meta(seqs, max_loras=1, num_linears=len(specs), max_slices=3)


@pytest.mark.parametrize("fn", PATHS, ids=PATH_IDS)
def test_bf16_path_close(fn):
    specs, pool, adapters, residents = setup_pool(torch.bfloat16)
    seqs = [(residents[i], 2) for i in range(6)]
    per_token = [adapters[i] for i in range(6) for _ in range(2)]
    meta = build_lora_meta(seqs, max_loras=8, num_linears=len(specs), max_slices=3)
    spec = specs[0]
    x = torch.randn(12, spec.in_features).bfloat16()
    y = torch.zeros(12, spec.out_features, dtype=torch.bfloat16)
    fn(x, y, pool.a[0], pool.b[0], meta, 0, spec.slice_offsets, spec.slice_sizes)
    want = reference_delta(x.float(), per_token, spec)
    torch.testing.assert_close(y.double(), want, atol=0.05, rtol=0.05)


def test_sgmv_chunks_bound_padding_and_mask_other_adapters_rows():
    """32 adapters x 2 tokens and one skewed batch: at most 2x adapters chunks and 2x tokens
    padded rows; each chunk's rank mask stops at its adapter's own rows."""
    specs, pool, adapters, residents = setup_pool()
    even = build_lora_meta(
        [(residents[i % 6], 1) for i in range(64)], max_loras=8, num_linears=len(specs),
        max_slices=3,
    )  # fmt: skip
    plan = build_sgmv_plan(even, pool.num_rows)
    assert plan.num_chunks <= 2 * 6 and plan.num_chunks * plan.chunk_size <= 2 * 64
    skew = build_lora_meta(
        [(residents[0], 40)] + [(residents[i], 1) for i in range(1, 6)],
        max_loras=8, num_linears=len(specs), max_slices=3,
    )  # fmt: skip
    plan = build_sgmv_plan(skew, pool.num_rows)
    assert plan.num_chunks <= 2 * 6 and plan.num_chunks * plan.chunk_size <= 2 * 45
    assert plan.rank == 64
    rows = plan.mask[:, 0, :, 0].sum(1).tolist()  # first chunk row of each chunk is a token
    assert rows[0] == residents[0].rows and residents[0].rows < 64
    assert plan.mask.sum() == sum(g.num_tokens * g.rows for g in skew.groups)


def test_sgmv_refuses_strided_last_dimension():
    specs, pool, adapters, residents = setup_pool()
    meta = build_lora_meta(
        [(residents[0], 1), (residents[1], 1)], max_loras=8, num_linears=len(specs),
        max_slices=3,
    )  # fmt: skip
    spec = specs[0]
    plan = build_sgmv_plan(meta, pool.num_rows)
    x = torch.randn(spec.in_features, 2).t()  # stride (1, 2): last dim not stride 1
    y = torch.zeros(2, spec.out_features)
    with pytest.raises(ValueError, match="stride-1"):
        lora_delta_sgmv(x, y, pool.a[0], pool.b[0], plan, 0, spec.slice_offsets, spec.slice_sizes)


def test_packed_plan_reads_one_run_in_place_and_gathers_otherwise():
    specs, pool, adapters, residents = setup_pool()
    run = build_lora_meta(
        [(None, 3), (residents[0], 2), (residents[1], 2), (None, 1)], max_loras=8,
        num_linears=len(specs), max_slices=3,
    )  # fmt: skip
    assert build_sgmv_plan(run, pool.num_rows).run_start == 3
    split = build_lora_meta(
        [(residents[0], 2), (None, 1), (residents[1], 2)], max_loras=8,
        num_linears=len(specs), max_slices=3,
    )  # fmt: skip
    assert build_sgmv_plan(split, pool.num_rows).run_start is None


def test_pack_cache_reuses_a_layout_and_repacks_a_new_one():
    specs, pool, adapters, residents = setup_pool()
    spec = specs[0]

    def plan_for(order):
        meta = build_lora_meta(
            [(residents[i], 2) for i in order], max_loras=8, num_linears=len(specs), max_slices=3
        )
        return build_sgmv_plan(meta, pool.num_rows)

    args = (pool.a[0], pool.b[0])
    cache = PackCache(max_bytes=1 << 30)
    first = cache.get(
        0, *args, plan_for([0, 1]), spec.slice_offsets, spec.slice_sizes, torch.float32
    )
    again = cache.get(
        0, *args, plan_for([0, 1]), spec.slice_offsets, spec.slice_sizes, torch.float32
    )
    assert again is first
    other = cache.get(
        0, *args, plan_for([1, 0]), spec.slice_offsets, spec.slice_sizes, torch.float32
    )
    assert other is not first and not torch.equal(other.a, first.a)
    # over budget: packed afresh each call, never kept, same values
    tiny = PackCache(max_bytes=0)
    p1 = tiny.get(0, *args, plan_for([0, 1]), spec.slice_offsets, spec.slice_sizes, torch.float32)
    p2 = tiny.get(0, *args, plan_for([0, 1]), spec.slice_offsets, spec.slice_sizes, torch.float32)
    assert p1 is not p2 and torch.equal(p1.a, first.a) and torch.equal(p1.b[0], first.b[0])


def test_packed_path_computes_16_bit_activations_in_fp32_on_cpu():
    assert lora_compute_dtype(torch.zeros(1, dtype=torch.bfloat16)) == torch.float32
    assert lora_compute_dtype(torch.zeros(1, dtype=torch.float16)) == torch.float32
    assert lora_compute_dtype(torch.zeros(1)) == torch.float32


@NO_CC
def test_native_kernel_splits_tokens_over_threads_and_reads_strided_rows():
    """64 tokens of 32 adapters over two OpenMP threads; x and y as column slices of wider
    rows (row stride past the width), as a fused projection hands them over."""
    specs, pool, adapters, residents = setup_pool()
    seqs = [(residents[i % 6], 1) for i in range(64)]
    per_token = [adapters[i % 6] for i in range(64)]
    meta = build_lora_meta(seqs, max_loras=8, num_linears=len(specs), max_slices=3)
    spec = specs[0]
    wide_x = torch.randn(64, spec.in_features + 5)
    wide_y = torch.randn(64, spec.out_features + 3)
    x, y = wide_x[:, : spec.in_features], wide_y[:, : spec.out_features]
    base, tail = y.clone(), wide_y[:, spec.out_features :].clone()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lora_delta_native_step(x, y, pool.a[0], pool.b[0], meta, 0, spec.slice_offsets,
                               spec.slice_sizes)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    want = base.double() + reference_delta(x, per_token, spec)
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(wide_y[:, spec.out_features :], tail)  # the columns past y untouched


@NO_CC
def test_native_kernel_refuses_mismatched_dtypes():
    specs, pool, adapters, residents = setup_pool()
    meta = build_lora_meta([(residents[0], 2)], max_loras=2, num_linears=len(specs), max_slices=3)
    spec = specs[0]
    x = torch.randn(2, spec.in_features)
    y = torch.zeros(2, spec.out_features, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp32/bf16 x and y alike"):
        lora_delta_native(x, y, pool.a[0], pool.b[0], meta, 0,
                          slice_bounds(spec.slice_offsets, spec.slice_sizes))  # fmt: skip
    wide = tuple(t.long() for t in slice_bounds(spec.slice_offsets, spec.slice_sizes))
    with pytest.raises(ValueError, match="int32"):
        lora_delta_native(x, y.float(), pool.a[0], pool.b[0], meta, 0, wide)
    with pytest.raises(ValueError, match="over 2 tokens"):  # fewer rows than the step's tokens
        lora_delta_native(x[:1], y[:1].float(), pool.a[0], pool.b[0], meta, 0,
                          slice_bounds(spec.slice_offsets, spec.slice_sizes))  # fmt: skip


WIDE_DIMS = {  # past the kernel's 256-column chunks, and not a multiple of them
    "q_proj": (300, 300),
    "k_proj": (300, 140),
    "v_proj": (300, 140),
    "o_proj": (300, 300),
    "gate_proj": (300, 530),
    "up_proj": (300, 530),
    "down_proj": (530, 300),
}


@NO_CC
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_kernel_wide_rows_and_token_blocks(dtype):
    """Rows wider than one converted chunk, ranks that are not multiples of four, and one
    adapter with 19 tokens (blocks of 8, 8 and 3) beside adapters with one or two."""
    specs = llama_specs(1, WIDE_DIMS)
    pool = DevicePool(specs, capacity_bytes=50_000_000, max_lora_rank=16, dtype=dtype)
    rank_sets = [{n: 16 for n in WIDE_DIMS}, {"q_proj": 5, "v_proj": 3, "up_proj": 7},
                 {"k_proj": 9, "o_proj": 1, "down_proj": 13}]  # fmt: skip
    adapters = [
        random_adapter(f"w{i}", r, seed=i, num_layers=1, dims=WIDE_DIMS, dtype=dtype)
        for i, r in enumerate(rank_sets)
    ]
    residents = [pool.load(a) for a in adapters]
    layout = [(0, 19), (1, 1), (None, 2), (2, 2), (1, 1)]
    seqs = [(None if i is None else residents[i], n) for i, n in layout]
    per_token = [None if i is None else adapters[i] for i, n in layout for _ in range(n)]
    meta = build_lora_meta(seqs, max_loras=4, num_linears=len(specs), max_slices=3)
    torch.manual_seed(3)
    for lid, spec in enumerate(specs):
        x = torch.randn(len(per_token), spec.in_features).to(dtype)
        base = torch.randn(len(per_token), spec.out_features).to(dtype)
        y = base.clone()
        lora_delta_native_step(x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets,
                               spec.slice_sizes)  # fmt: skip
        want = base.double() + reference_delta(x.float(), per_token, spec)
        tol = 1e-5 if dtype == torch.float32 else 0.05
        torch.testing.assert_close(y.double(), want, atol=tol, rtol=tol)


@NO_CC
def test_native_kernel_rows_do_not_depend_on_their_block():
    """A token's output is bit-identical whether it is alone or the fourth of a block of eight:
    the kernel's sums must not change order with where its scratch rows fall (else greedy
    decoding can differ between two processes serving the same request)."""
    specs = llama_specs(1, WIDE_DIMS)
    pool = DevicePool(specs, capacity_bytes=50_000_000, max_lora_rank=16, dtype=torch.bfloat16)
    adapter = random_adapter("w", {n: 16 for n in WIDE_DIMS}, seed=1, num_layers=1,
                             dims=WIDE_DIMS, dtype=torch.bfloat16)  # fmt: skip
    resident = pool.load(adapter)
    torch.manual_seed(5)
    for lid, spec in enumerate(specs):
        x = torch.randn(8, spec.in_features).bfloat16()
        y0 = torch.randn(8, spec.out_features).bfloat16()
        bounds = slice_bounds(spec.slice_offsets, spec.slice_sizes)
        together = y0.clone()
        meta8 = build_lora_meta([(resident, 8)], max_loras=1, num_linears=len(specs), max_slices=3)
        lora_delta_native(x, together, pool.a[lid], pool.b[lid], meta8, lid, bounds)
        meta1 = build_lora_meta([(resident, 1)], max_loras=1, num_linears=len(specs), max_slices=3)
        for t in range(8):
            alone = y0[t : t + 1].clone()
            lora_delta_native(x[t : t + 1], alone, pool.a[lid], pool.b[lid], meta1, lid, bounds)
            assert torch.equal(alone[0], together[t]), (lid, t)

"""Cases for the Triton shrink/expand kernels under TRITON_INTERPRET=1 against the torch path.

Run by test_lora_kernels_triton.py in a fresh interpreter with TRITON_INTERPRET=1 (Triton reads
it when the kernels are defined, and other tests import them first). Covers mixed ranks (4..64, per-slice), tokens with no adapter (slot -1), padding tokens, an
adapter split across several runs, unused `max_loras` slots (empty groups) and bf16.
"""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1 (see test_lora_kernels_triton.py)")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from support.lora_reference import llama_specs, random_adapter, reference_delta  # noqa: E402

from loraplex.adapters.device_pool import DevicePool  # noqa: E402
from loraplex.adapters.kernels import lora_triton  # noqa: E402
from loraplex.adapters.kernels.lora_torch import lora_delta_torch  # noqa: E402
from loraplex.adapters.metadata import build_lora_meta  # noqa: E402

RANK_SETS = [
    {"q_proj": 4, "v_proj": 4},
    {"q_proj": 64, "k_proj": 64, "v_proj": 64, "o_proj": 64, "down_proj": 64},
    {"q_proj": 16, "k_proj": 5, "gate_proj": 33, "up_proj": 8},
    {"o_proj": 12, "down_proj": 7},
    {"k_proj": 20, "v_proj": 48, "up_proj": 16},
]
LAYOUT = [(0, 3), (None, 2), (1, 1), (2, 18), (0, 1), (3, 1), (None, 1), (4, 2), (1, 2)]


def _setup(dtype):
    specs = llama_specs(num_layers=1)
    pool = DevicePool(specs, capacity_bytes=8_000_000, max_lora_rank=64, dtype=dtype)
    adapters = [
        random_adapter(f"k{i}", r, seed=i, num_layers=1, dtype=dtype)
        for i, r in enumerate(RANK_SETS)
    ]
    residents = [pool.load(a) for a in adapters]
    seqs = [(None if i is None else residents[i], n) for i, n in LAYOUT]
    per_token = [None if i is None else adapters[i] for i, n in LAYOUT for _ in range(n)]
    pad = 3
    meta = build_lora_meta(
        seqs, max_loras=8, num_linears=len(specs), max_slices=3, num_tokens=len(per_token) + pad
    )
    return specs, pool, meta, per_token + [None] * pad


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_triton_matches_torch_path(dtype, tol):
    specs, pool, meta, per_token = _setup(dtype)
    torch.manual_seed(0)
    for lid, spec in enumerate(specs):
        x = torch.randn(len(per_token), spec.in_features).to(dtype)
        base = torch.randn(len(per_token), spec.out_features).to(dtype)
        y_tr = base.clone()
        lora_triton.lora_delta_triton(
            x, y_tr, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes, 64
        )
        y_pt = base.clone()
        lora_delta_torch(
            x, y_pt, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes
        )
        torch.testing.assert_close(y_tr.float(), y_pt.float(), atol=tol, rtol=tol)
        if dtype == torch.float32:
            want = base.double() + reference_delta(x, per_token, spec)
            torch.testing.assert_close(y_tr.double(), want, atol=1e-4, rtol=1e-4)
        # tokens with no adapter are untouched, exactly
        none_rows = [t for t, a in enumerate(per_token) if a is None]
        assert torch.equal(y_tr[none_rows], base[none_rows])


def test_shrink_output_per_slot():
    specs, pool, meta, per_token = _setup(torch.float32)
    spec = specs[0]
    x = torch.randn(len(per_token), spec.in_features)
    h = lora_triton.lora_shrink_triton(x, pool.a[0], meta, 0, 64)
    assert h.shape == (3, len(per_token), 64)
    for t, ad in enumerate(per_token):
        if ad is None:
            continue
        for si, name in enumerate(spec.slice_names):
            m = ad.modules.get((0, name))
            if m is not None:
                torch.testing.assert_close(h[si, t, : m.rank], m.a @ x[t], atol=1e-4, rtol=1e-4)


def test_no_active_adapters_is_a_no_op():
    specs = llama_specs(num_layers=1)
    pool = DevicePool(specs, capacity_bytes=4_000_000, max_lora_rank=64)
    meta = build_lora_meta([(None, 5)], max_loras=4, num_linears=len(specs), max_slices=3)
    spec = specs[0]
    x = torch.randn(5, spec.in_features)
    y = torch.randn(5, spec.out_features)
    want = y.clone()
    lora_triton.lora_delta_triton(
        x, y, pool.a[0], pool.b[0], meta, 0, spec.slice_offsets, spec.slice_sizes, 64
    )
    assert torch.equal(y, want)

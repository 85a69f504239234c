"""Float expert stacks packed for oneDNN at load on a CPU: the block holds the packed matrices
instead of the dense stack (no second copy), gives the same outputs as plain matmuls, and reads
its weights back exactly."""

from __future__ import annotations

import pytest
import torch

from loraplex.moe.experts_torch import fused_experts_torch
from loraplex.moe.gating import GatingConfig, softmax_topk
from loraplex.moe.layer import MoEBlock
from loraplex.moe.packed_experts import PackedExperts, can_pack_experts
from loraplex.moe.spec import MoESpec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_packs_float_experts_and_matches_plain_matmuls(dtype):
    if not can_pack_experts(torch.empty(1, 1, 1, dtype=dtype)):
        pytest.skip(f"this CPU / build does not pack {dtype} for oneDNN")
    g = torch.Generator().manual_seed(0)
    h, i, e = 32, 16, 6
    spec = MoESpec(h, i, e, GatingConfig(top_k=2, renormalize=True))
    block = MoEBlock(spec, dtype=dtype)
    gate_up = torch.randn(e, 2 * i, h, generator=g).to(dtype)
    down = torch.randn(e, h, i, generator=g).to(dtype)
    block.load_weight("gate.weight", torch.randn(e, h, generator=g).to(dtype))
    block.load_weight("experts.gate_up_proj", gate_up)
    block.load_weight("experts.down_proj", down)
    assert isinstance(block.stack("w13"), PackedExperts) and block.w13.is_meta
    assert torch.equal(block.dense_stack("w13"), gate_up)
    assert torch.equal(block.dense_stack("w2"), down)
    x = torch.randn(9, h, generator=g).to(dtype)
    weights, ids = softmax_topk(torch.randn(9, e, generator=g), 2, renormalize=True)
    got = fused_experts_torch(x, block.stack("w13"), block.stack("w2"), weights, ids)
    want = fused_experts_torch(x, gate_up, down, weights, ids)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="cannot pack"):
        PackedExperts(gate_up.to(torch.float16))

"""Run with TRITON_INTERPRET=1 (set before triton is imported) by test_moe_experts_triton.py:
compares the Triton grouped MoE kernels with the torch expert path; prints one JSON line of
{case: max_abs_error}."""

from __future__ import annotations

import json
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1")

import torch  # noqa: E402

from loraplex.moe.experts_torch import fused_experts_torch  # noqa: E402
from loraplex.moe.experts_triton import fused_experts_triton  # noqa: E402

CASES = {
    # name: (tokens, experts, top_k, hidden, inter, dtype, remote experts)
    "decode_fp32": (3, 8, 2, 32, 48, torch.float32, False),
    "prefill_fp32": (37, 6, 3, 40, 24, torch.float32, False),
    "expert_map_fp32": (21, 8, 2, 32, 32, torch.float32, True),
    "prefill_fp16": (19, 4, 2, 32, 32, torch.float16, False),
}


def run_case(tokens, experts, top_k, hidden, inter, dtype, remote) -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) * 0.2).to(dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g)
    emap = None
    if remote:  # this rank holds the odd experts only, in slots 0..experts/2-1
        emap = torch.full((experts,), -1, dtype=torch.int64)
        emap[1::2] = torch.arange(experts // 2)
        w13, w2 = w13[1::2].contiguous(), w2[1::2].contiguous()
    got = fused_experts_triton(x, w13, w2, weights, ids, emap).float()
    ref = fused_experts_torch(x.float(), w13.float(), w2.float(), weights, ids, emap)
    assert ref.abs().max() > 0.1
    return float((got - ref).abs().max())


if __name__ == "__main__":
    print(json.dumps({name: run_case(*case) for name, case in CASES.items()}))

"""Run with TRITON_INTERPRET=1 (set before triton is imported) by test_moe_expert_lora.py:
compares the Triton expert-LoRA kernels with the torch expert-LoRA path (mixed adapters and
base tokens in one batch); prints one JSON line of {case: [max_abs_error, max_abs_lora_delta]}."""

from __future__ import annotations

import json
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1")

import torch  # noqa: E402

from loraplex.moe.expert_lora import (  # noqa: E402
    ExpertLoraBatch,
    ExpertLoraWeights,
    fused_experts_lora_torch,
)
from loraplex.moe.expert_lora_triton import fused_experts_lora_triton  # noqa: E402

CASES = {
    # name: (tokens, experts, top_k, hidden, inter, remote experts)
    "decode_fp32": (3, 8, 2, 32, 48, False),
    "rank_over_16_fp32": (9, 4, 2, 32, 32, False),
    "prefill_fp32": (29, 6, 3, 40, 24, False),
    "expert_map_fp32": (21, 8, 2, 32, 32, True),
}


def _lora(g, experts, hidden, inter, rank, down_only=False) -> ExpertLoraWeights:
    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    return ExpertLoraWeights(
        w13_a=None if down_only else r(experts, rank, hidden),
        w13_b=None if down_only else r(experts, 2 * inter, rank),
        w2_a=r(experts, rank + 1, inter), w2_b=r(experts, hidden, rank + 1),
    )  # fmt: skip


def run_case(tokens, experts, top_k, hidden, inter, remote) -> list[float]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.2
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g)
    emap, local = None, experts
    if remote:  # this rank holds the odd experts only, in slots 0..experts/2-1
        emap = torch.full((experts,), -1, dtype=torch.int64)
        emap[1::2] = torch.arange(experts // 2)
        w13, w2, local = w13[1::2].contiguous(), w2[1::2].contiguous(), experts // 2
    rank = 20 if tokens == 9 else 4  # a rank past 16: padded to 32
    slots = [_lora(g, local, hidden, inter, rank), None, _lora(g, local, hidden, inter, 3, True)]
    lora = ExpertLoraBatch(torch.randint(-1, 3, (tokens,), generator=g), slots)
    got = fused_experts_lora_triton(x, w13, w2, weights, ids, lora, emap)
    ref = fused_experts_lora_torch(x, w13, w2, weights, ids, lora, emap)
    base = fused_experts_lora_torch(
        x, w13, w2, weights, ids, ExpertLoraBatch(lora.token_slot, [None] * 3), emap
    )
    return [float((got - ref).abs().max()), float((ref - base).abs().max())]


if __name__ == "__main__":
    print(json.dumps({name: run_case(*case) for name, case in CASES.items()}))

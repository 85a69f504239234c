"""The MoE block's forward for the deterministic mode: every token's result fixed by its own row.

Each reduction runs through the fixed-order CPU kernels (`fixed_order_cpu.c`), whose result for
a row never depends on the rows beside it: the router's logits, each expert's gate/up and down
projection over the rows routed to it (grouping rows by expert changes nothing then), the
shared expert and its sigmoid gate. SiLU-and-mul is the kernel's scalar loop. What is left is
row-wise or elementwise: softmax and top-k over one token's expert logits, and the weighted
sum of a token's k expert outputs in the router's order (fp32 multiply-adds, one rounding each).
"""

from __future__ import annotations

import torch

from loraplex.moe.layer import MoEBlock
from loraplex.moe.packed_experts import PackedExperts
from loraplex.moe.quant_experts import QuantizedExperts, from_cpu_int4_layout, pack_nibbles
from loraplex.platform.engine.layers.fixed_order_cpu import (
    FixedOrderWeight,
    fixed_order_linear,
    fixed_order_sigmoid_scale,
    fixed_order_silu_mul,
)

ExpertWeight = torch.Tensor | FixedOrderWeight


def expert_weights(stack: torch.Tensor | QuantizedExperts | PackedExperts) -> list[ExpertWeight]:
    """Each expert's [N, K] weight of a stack as the fixed-order kernel reads it."""
    if isinstance(stack, PackedExperts):
        stack = stack.dense()
    if isinstance(stack, torch.Tensor):
        return [stack[e].contiguous() for e in range(stack.shape[0])]
    out: list[ExpertWeight] = []
    for e in range(stack.codes.shape[0]):
        codes, scale = stack.codes[e], stack.scale[e]
        if stack.kind == "int4":  # scale [G, N, 2]: (s, zf) per group
            q = from_cpu_int4_layout(codes) if stack.cpu_int4 else None
            nibbles = pack_nibbles(q) if q is not None else codes.contiguous()
            s, zf = (scale[..., i].t().float().contiguous() for i in (0, 1))
            out.append(FixedOrderWeight("int4", nibbles, s, zf, stack.group))
        else:
            out.append(FixedOrderWeight(stack.kind, codes.contiguous(), scale.float().contiguous()))
    return out


class FixedOrderExperts:
    """A MoE block's weights laid out once for the fixed-order kernels, and its forward."""

    def __init__(self, block: MoEBlock) -> None:
        if block.ep is not None:
            raise NotImplementedError("the deterministic mode does not cover expert parallelism")
        self.block = block
        self.w13 = expert_weights(block.stack("w13"))
        self.w2 = expert_weights(block.stack("w2"))
        self.shared: tuple[ExpertWeight, ExpertWeight] | None = None
        if block.shared_w13 is not None and block.shared_w2 is not None:
            if "shared_w13" in block._stacks:  # a quantized shared expert: one-slot stacks
                (w13,), (w2,) = (
                    expert_weights(block.stack(n)) for n in ("shared_w13", "shared_w2")
                )
            else:
                w13, w2 = block.shared_w13.data.contiguous(), block.shared_w2.data.contiguous()
            self.shared = (w13, w2)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits in a fixed order, then the block's own row-wise gating."""
        from loraplex.moe.gating import select_experts

        block = self.block
        if block.spec.gating.scoring == "sigmoid":  # DeepSeek-V3's router runs in fp32
            logits = fixed_order_linear(x.float(), block.gate_weight.float())
        else:
            logits = fixed_order_linear(x, block.gate_weight.data)
        return select_experts(logits, block.spec.gating, block.e_score_correction_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]."""
        block = self.block
        if block.expert_lora is not None and block.expert_lora(block) is not None:
            raise NotImplementedError(
                "the deterministic mode does not cover adapters on MoE experts or the router yet"
            )
        weights, ids = self.route(x)
        if block.load_recorder is not None:
            block.load_recorder.record(block.layer_idx, ids)
        top_k = ids.shape[1]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(self.w13)).tolist()
        rows = x[order // top_k]
        expert_out = torch.empty_like(rows)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                part = rows[start : start + count]
                act = fixed_order_silu_mul(fixed_order_linear(part, self.w13[expert]))
                expert_out[start : start + count] = fixed_order_linear(act, self.w2[expert])
            start += count
        per_pair = torch.empty_like(expert_out)
        per_pair[order] = expert_out
        per_pair = per_pair.view(x.shape[0], top_k, -1).float()
        w = weights.float()
        out = per_pair[:, 0] * w[:, 0:1]
        for k in range(1, top_k):  # the router's order, one product and one sum at a time
            out = out + per_pair[:, k] * w[:, k : k + 1]
        out = out.to(x.dtype)
        if self.shared is not None:
            out = out + self._shared(x, *self.shared)
        return out

    def _shared(self, x: torch.Tensor, w13: ExpertWeight, w2: ExpertWeight) -> torch.Tensor:
        out = fixed_order_linear(fixed_order_silu_mul(fixed_order_linear(x, w13)), w2)
        if self.block.shared_gate is not None:
            gate = fixed_order_linear(x, self.block.shared_gate.data)
            out = fixed_order_sigmoid_scale(gate, out)
        return out

"""The transformers oracle for quantized MoE models: a copy whose projections and routed
experts hold the dequantized weights a quantization choice stores (quantized and
dequantized by `loader/quant/weight_only.py`, the formats' owner, one expert at a time)."""

from __future__ import annotations

import copy

import torch

from loraplex.loader.quant.schemes import resolve_scheme
from loraplex.loader.quant.weight_only import (
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    quantize_fp8_per_channel,
    quantize_int4_grouped,
    quantize_int8_per_channel,
)

# attention, dense MLP and shared-expert projections (not a router's `gate`)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
EXPERT_STACKS = ("experts.gate_up_proj", "experts.down_proj")


def dequantized(weight: torch.Tensor, choice: str) -> torch.Tensor:
    """A weight [N, K] after quantizing with `choice` and dequantizing, in fp32."""
    scheme = resolve_scheme(choice)
    if scheme.kind == "int8":
        return dequantize_int8(*quantize_int8_per_channel(weight), torch.float32)
    if scheme.kind == "fp8":
        return dequantize_fp8(*quantize_fp8_per_channel(weight), torch.float32)
    if scheme.kind == "int4":
        q, s, z = quantize_int4_grouped(weight, scheme.group_size, symmetric=scheme.symmetric)
        return dequantize_int4(q, s, z, torch.float32)
    raise ValueError(f"{choice!r} does not quantize weights")


def dequantized_moe_copy(
    hf: torch.nn.Module, choice: str, *, experts: bool = True
) -> torch.nn.Module:
    """The transformers MoE model with its projections (attention, dense MLPs, shared experts)
    and (unless `experts` is False) every routed expert's weights replaced by what `choice`
    stores; routers, norms, embeddings and head unchanged."""
    ref = copy.deepcopy(hf)
    touched = 0
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
                p.copy_(dequantized(p.data, choice))
                touched += 1
            elif experts and name.endswith(EXPERT_STACKS):  # transformers v5: [E, N, K] per layer
                for e in range(p.shape[0]):
                    p[e].copy_(dequantized(p.data[e], choice))
                touched += 1
    if not touched:
        raise ValueError("no projection or expert stack found to dequantize")
    return ref

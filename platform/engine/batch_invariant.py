"""The deterministic mode: switch a loaded model onto batch-invariant kernels, or refuse.

With `EngineConfig.deterministic` every reduction whose order could follow the batch runs in
one fixed order (`layers/fixed_order_cpu.c`: projections, float or quantized on load (int8,
int4, fp8: `layers/quant/fixed_order.py`), the LM head, RMSNorm, and the gated MLP's SiLU,
whose vectorised torch loop treats a row's tail apart when a batch splits it between threads;
`layers/fixed_order_experts.py`: the MoE router, experts and shared expert;
`layers/fixed_order_attention.py`: each query token alone through the native decode kernel;
the native LoRA kernel is per token already). What is left is elementwise (residual adds;
rotary cos/sin, found row-invariant up to 3,000 positions a step), row-wise (the router's
softmax and top-k over one token) and gathers. Configurations the mode does not cover yet are
refused here, naming what is missing, rather than served with a promise they would break.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from loraplex.moe.layer import MoEBlock
from loraplex.platform.engine.layers.attention import Attention
from loraplex.platform.engine.layers.fixed_order_cpu import (
    fixed_order_available,
    fixed_order_linear,
)
from loraplex.platform.engine.layers.fixed_order_experts import FixedOrderExperts
from loraplex.platform.engine.layers.linear import Linear
from loraplex.platform.engine.layers.norm import RMSNorm
from loraplex.platform.engine.layers.onednn_weights import dense, is_packed
from loraplex.platform.engine.layers.paged_attention_cpu import LIBRARY as ATTENTION_LIBRARY
from loraplex.platform.engine.layers.quant.base import frozen
from loraplex.platform.engine.layers.quant.fixed_order import fixed_order_weight, uncovered_scheme
from loraplex.platform.engine.models.decoder import DenseMLP, LMHead
from loraplex.platform.engine_spec.config import EngineConfig

DTYPES = (torch.float32, torch.bfloat16)


class DeterministicModeUnsupported(NotImplementedError):
    """The deterministic mode was asked for a configuration it does not cover yet."""


class FixedOrderHead(nn.Module):
    """The LM head through the fixed-order kernel (its weight read from the wrapped head, so a
    tied embedding stays shared)."""

    def __init__(self, head: LMHead) -> None:
        super().__init__()
        if is_packed(head.weight):  # an untied head packed for oneDNN: unpacked once, here
            head.weight = nn.Parameter(dense(head.weight.data), requires_grad=False)
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] in the weight's dtype."""
        return fixed_order_linear(hidden, self.head.weight)


def _fix_linear(module: Linear) -> None:
    """One projection onto the fixed-order kernel: a plain weight unpacked from oneDNN, a
    quantized one read by the kernel in its codes."""
    if module.quant_method is None:
        module.weight = nn.Parameter(dense(module.weight.data).contiguous(), requires_grad=False)
    else:
        weight = fixed_order_weight(module)
        module.weight = frozen(weight.codes)  # int4: the kernel's layout replaces torch's
        module.quant_kernel = "fixed_order"
        module.fixed_order_weight = weight
    module.fixed_order = True


def refusal(config: EngineConfig, hf_config: dict[str, Any], dtype: torch.dtype) -> str | None:
    """Why the deterministic mode cannot serve this engine, or None when it can."""
    why = config.deterministic_refusal()
    if why is not None:
        return why
    if dtype not in DTYPES:
        return f"compute dtype {dtype} (fp32 and bf16 only)"
    if not fixed_order_available():
        return "this machine: the fixed-order C kernels cannot be built here (no C compiler?)"
    if not ATTENTION_LIBRARY.available:
        return (
            f"this machine: the native attention kernel is unavailable ({ATTENTION_LIBRARY.error})"
        )
    return None


def make_batch_invariant(
    model: nn.Module, config: EngineConfig, hf_config: dict[str, Any], dtype: torch.dtype
) -> None:
    """Put `model` on the batch-invariant kernels; raises DeterministicModeUnsupported."""
    why = refusal(config, hf_config, dtype)
    if why is not None:
        raise DeterministicModeUnsupported(f"the deterministic mode does not cover {why} yet")
    modules = list(model.modules())
    for module in modules:  # refuse before changing anything
        method = getattr(module, "quant_method", None) if isinstance(module, Linear) else None
        gap = uncovered_scheme(method.scheme) if method is not None else None
        if gap is not None:
            raise DeterministicModeUnsupported(f"the deterministic mode does not cover {gap} yet")
    for module in modules:
        if isinstance(module, Linear):
            try:
                _fix_linear(module)
            except NotImplementedError as exc:
                raise DeterministicModeUnsupported(str(exc)) from exc
        elif isinstance(module, RMSNorm | Attention | DenseMLP):
            module.fixed_order = True
        elif isinstance(module, MoEBlock):
            module.unpack_stacks()  # plain float stacks: the kernel reads them in place
            try:
                module.deterministic_forward = FixedOrderExperts(module).forward
            except NotImplementedError as exc:
                raise DeterministicModeUnsupported(str(exc)) from exc
    head = getattr(model, "lm_head", None)
    if not isinstance(head, LMHead):
        raise DeterministicModeUnsupported(f"{type(model).__name__} has no lm_head to fix")
    model.lm_head = FixedOrderHead(head)

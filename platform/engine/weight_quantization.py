"""The deployment's weight quantization choice, as the engine serves it.

Casts (fp32 / bf16 / fp16) set the dtype the model runs in. int8 (W8A16), int4 / int4_sym
(W4A16, groups of 128) and fp8 (W8A8 e4m3) store the Linear layers' weights quantized
(`layers/quant/`) and MoE blocks their routed and shared experts (`moe/quant_experts.py`,
weight-only, quantized by the block as they load); everything else (embeddings, norms, the
head, routers) and the activations stay in the engine's compute dtype (`EngineConfig.dtype`;
deployments run quantized choices in bfloat16). The loader quantizes exactly the model's
quantized Linears' weights as they stream in. A compressed-tensors, AWQ (gemm) or GPTQ
checkpoint fixes its own scheme: it is read into the same layout, never re-quantized (awq /
gptq name those checkpoints and are refused for a plain one). Unknown choices are a ValueError.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from loraplex.loader.quant import Quantizer, QuantScheme, parse_quantization, resolve_scheme
from loraplex.loader.quant.awq_gptq import AwqGptqReader
from loraplex.loader.quant.compressed_tensors import (
    CompressedTensorsReader,
    checkpoint_quant_method,
    compressed_tensors_scheme,
)
from loraplex.loader.quant_choices import PREQUANTIZED
from loraplex.platform.engine.layers.quant import linear_quantization
from loraplex.platform.engine.models.weight_loading import (
    quantized_linear_inputs,
    quantized_weight_names,
)
from loraplex.platform.engine_spec.prequantized import awq_gptq_format

Reader = Quantizer | CompressedTensorsReader | AwqGptqReader


@dataclass(frozen=True)
class WeightQuantization:
    """A validated choice: its canonical name, scheme and, when set, the model's dtype."""

    choice: str
    cast_to: torch.dtype | None
    scheme: QuantScheme
    prequantized: bool = False  # the checkpoint stores the scheme (read, not re-quantized)

    @contextmanager
    def building(self) -> Iterator[None]:
        """Build the model inside this block so its Linears store weights as the scheme says."""
        with linear_quantization(self.scheme):
            yield

    def quantizer(self, model: nn.Module | None = None) -> Reader | None:
        """The loader's per-tensor quantizer (None when nothing changes); given the built model,
        it quantizes exactly the weights of the model's quantized Linears (a pre-quantized
        checkpoint is read into the same layout instead)."""
        if self.prequantized:
            if model is None:
                raise ValueError("reading a pre-quantized checkpoint needs the built model")
            if self.scheme.name in PREQUANTIZED:
                return AwqGptqReader(self.scheme, quantized_linear_inputs(model))
            return CompressedTensorsReader(self.scheme, quantized_linear_inputs(model))
        if self.choice in ("none", "auto"):
            return None
        if model is None or not self.scheme.quantizes_linears:
            return Quantizer(self.scheme)
        names = quantized_weight_names(model)
        return Quantizer(self.scheme, targets=names.__contains__)


def _family(name: str) -> str:
    return "int4" if name.startswith("int4") else name


def _checkpoint_scheme(hf_config: dict[str, Any]) -> QuantScheme | None:
    """The scheme a pre-quantized checkpoint fixes (None if plain); NotImplementedError for
    one the engine does not read."""
    fmt = awq_gptq_format(hf_config)
    if fmt is None:
        return compressed_tensors_scheme(hf_config)
    return QuantScheme(
        fmt.method, "int4", None, fmt.group_size, symmetric=False, act_order=fmt.act_order
    )


def resolve_weight_quantization(
    choice: str | None, hf_config: dict[str, Any] | None = None
) -> WeightQuantization:
    """Validate a quantization choice for serving the checkpoint of `hf_config` (ValueError if
    unknown or if it contradicts a pre-quantized checkpoint's own scheme)."""
    method = checkpoint_quant_method(hf_config or {})
    if method is None:
        scheme = resolve_scheme(choice)
        return WeightQuantization(scheme.name, scheme.cast_to, scheme)
    fixed = _checkpoint_scheme(hf_config or {})
    if fixed is None:
        raise NotImplementedError(
            f"pre-quantized {method!r} checkpoints are not read; served: compressed-tensors "
            "(int4 pack-quantized, int8, fp8), AWQ gemm and GPTQ (4-bit, group 128), or a "
            "bf16/fp16 checkpoint quantized on load"
        )
    asked = parse_quantization(choice)
    if asked not in ("none", "auto") and _family(asked) != _family(fixed.name):
        raise ValueError(
            f"the checkpoint is pre-quantized ({method}, {fixed.name}) and fixes its own scheme; "
            f"serve it with quantization {_family(fixed.name)!r} (or none), not {choice!r}"
        )
    return WeightQuantization(fixed.name, None, fixed, prequantized=True)


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters and buffers hold (a tied tensor counted once)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        # oneDNN-packed tensors have no storage; a meta stack stands for its packed experts
        key = t.data_ptr() if t.layout == torch.strided and not t.is_meta else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total

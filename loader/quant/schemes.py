"""Quantization choices: their canonical names and what each one stores per linear weight."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.loader.quant_choices import (
    ALIASES,
    AUTO,
    CAST_DTYPES,
    INT4_GROUP_SIZE,
    NOT_IMPLEMENTED,
    PREQUANTIZED,
    QUANTIZED,
)

__all__ = ["INT4_GROUP_SIZE", "PREQUANTIZED", "QUANTIZED", "QuantScheme", "parse_quantization"]

_CASTS: dict[str, torch.dtype | None] = {
    "none": None,
    AUTO: None,
    **{name: getattr(torch, dtype) for name, dtype in CAST_DTYPES.items()},
}
"""Each canonical cast choice and the dtype it stores everything in (None: no cast)."""


@dataclass(frozen=True)
class QuantScheme:
    """One choice: `kind` is cast | int8 | int4 | fp8; int4 has a group size and symmetry;
    `cast_to` is the dtype a cast stores everything in (None for the quantized choices: what
    they do not quantize, and the activations, stay in the engine's compute dtype)."""

    name: str
    kind: str
    cast_to: torch.dtype | None
    group_size: int = 0
    symmetric: bool = True
    act_order: bool = False  # GPTQ desc_act: inputs are permuted so groups are contiguous
    static_input: bool = False  # fp8: activations quantized with the checkpoint's input_scale

    @property
    def quantizes_linears(self) -> bool:
        """Whether linear weights are stored quantized (not just cast)."""
        return self.kind != "cast"


def parse_quantization(choice: str | None) -> str:
    """Canonical form of a choice; ValueError if unknown, NotImplementedError if unbuilt."""
    key = "none" if choice is None else str(choice).strip().lower()
    if key in ALIASES:
        return ALIASES[key]
    if key in NOT_IMPLEMENTED:
        raise NotImplementedError(
            f"weight quantization {choice!r} is not implemented in the loader; implemented: "
            "none, fp32, bf16, fp16, int8, int4, int4_sym, fp8, and awq / gptq for checkpoints "
            "stored in those formats"
        )
    raise ValueError(
        f"unknown weight quantization {choice!r}; expected one of none, fp32, bf16, fp16, "
        "int8, int4, int4_sym, fp8, awq, gptq"
    )


def resolve_scheme(choice: str | None) -> QuantScheme:
    """The scheme of a choice quantized on load (ValueError for awq / gptq, which only a
    checkpoint in that format fixes)."""
    name = parse_quantization(choice)
    if name in PREQUANTIZED:
        raise ValueError(
            f"weight quantization {name!r} reads a pre-quantized {name.upper()} checkpoint; "
            "this checkpoint is not one (it stores plain weights): use int4 to quantize it to "
            "4 bits on load (or int8 / fp8)"
        )
    if name in _CASTS:
        return QuantScheme(name, "cast", _CASTS[name])
    if name in ("int8", "fp8"):
        return QuantScheme(name, name, None)
    return QuantScheme(name, "int4", None, group_size=INT4_GROUP_SIZE, symmetric=name == "int4_sym")

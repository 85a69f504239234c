"""The quantization choices by name: the one table the loader, the engine, the control plane,
the database and the API read (issue 28). Torch-free and in the lowest layer, since the loader
parses the choices too and may not import the platform; the rules over these names (what a
model and device can serve) are `loraplex.platform.engine_spec.quantization`'s.
"""

from __future__ import annotations

from typing import Final

AUTO: Final = "auto"
"""Weights: the device's native compute type, or the scheme a pre-quantized checkpoint fixes."""

CAST_DTYPES: Final = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Choices that cast every weight on load, and the torch dtype (by name) each one casts to."""
CASTS: Final = tuple(CAST_DTYPES)

QUANTIZED_ON_LOAD: Final = ("int8", "int4", "int4_sym", "fp8")
"""Choices that store the Linear weights in fewer bits, quantized while loading: int8 (W8A16),
int4 (W4A16, groups of 128, asymmetric; int4_sym symmetric) and fp8 (W8A8 e4m3)."""
INT4_CHOICES: Final = ("int4", "int4_sym")
INT4_GROUP_SIZE: Final = 128

PREQUANTIZED: Final = ("awq", "gptq")
"""Choices naming a pre-quantized checkpoint format: read as the checkpoint stores it (int4,
groups of 128), never produced by quantizing on load."""
QUANTIZED: Final = (*QUANTIZED_ON_LOAD, *PREQUANTIZED)
"""Choices that store linear weights in fewer bits (the rest are casts)."""

WEIGHT_CHOICES: Final = (
    AUTO,
    "fp32",
    "bf16",
    "fp16",
    "fp8",
    "int8",
    "int4",
    "int4_sym",
    *PREQUANTIZED,
)
"""Every deployment weight choice, in the order the API and error messages show them."""

KV_CACHE_CHOICES: Final = (AUTO, "fp8")
"""`auto` stores K/V in the model's dtype; `fp8` in e4m3 with per-layer scales."""

ALIASES: Final = {
    "none": "none",
    AUTO: AUTO,
    **{name: name for name in (*CASTS, *QUANTIZED)},
    **{dtype: name for name, dtype in CAST_DTYPES.items()},
    "w8a16": "int8",
    "int8_weight_only": "int8",
    "w4a16": "int4",
    "int4_asym": "int4",
    "w4a16_sym": "int4_sym",
    "fp8_e4m3": "fp8",
    "w8a8_fp8": "fp8",
}
"""The names the engine's `--quantization` also accepts, each to its canonical choice."""
NOT_IMPLEMENTED: Final = ("fp8_e5m2",)

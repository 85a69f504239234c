"""What the engine serves: architectures (HuggingFace `architectures` names, with their family)
and deployment weight quantizations.

Torch-free on purpose: the control plane (base model registration, deployments, `up`) refuses
what the engine cannot serve without importing the engine's model code. Tests keep these tables
equal to what `models/registry.py` registers and `weight_quantization.py` accepts.
"""

from __future__ import annotations

from typing import Any, Literal

from loraplex.platform.engine_spec.quantization import KV_CACHE_CHOICES, WEIGHT_CHOICES

Family = Literal["dense", "moe"]

SUPPORTED_ARCHITECTURES: dict[str, Family] = {
    "LlamaForCausalLM": "dense",
    "Qwen2ForCausalLM": "dense",
    "Qwen3ForCausalLM": "dense",
    "MixtralForCausalLM": "moe",
    "Qwen2MoeForCausalLM": "moe",
    "Qwen3MoeForCausalLM": "moe",
    "DeepseekV2ForCausalLM": "moe",
    "DeepseekV3ForCausalLM": "moe",
}


def config_architectures(hf_config: dict[str, Any]) -> list[str]:
    """The `architectures` a HuggingFace config names (a lone string counts as one)."""
    archs = hf_config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def served_architecture(hf_config: dict[str, Any]) -> str | None:
    """The first architecture of `hf_config` the engine serves (what it will build), or None."""
    for arch in config_architectures(hf_config):
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    return None


SERVED_WEIGHT_QUANTIZATIONS: tuple[str, ...] = WEIGHT_CHOICES
"""Deployment weight choices the engine implements: `auto` (the device's native compute type,
or a pre-quantized checkpoint's own scheme), casts on load, int8 (W8A16), int4 (W4A16,
groups of 128, asymmetric; `int4_sym` symmetric) and fp8 (W8A8 e4m3) quantized on load; awq and
gptq serve checkpoints stored in those 4-bit formats as they are (W4A16)."""


SERVED_KV_CACHE_DTYPES: tuple[str, ...] = KV_CACHE_CHOICES
"""KV-cache choices the engine implements: `auto` stores K/V in the model's dtype, `fp8` in
e4m3 with per-layer scales."""


def unserved_kv_cache_message(choice: str) -> str:
    """Why a deployment with KV-cache dtype `choice` cannot be served, and what to use."""
    return (
        f"KV cache dtype {choice!r} is not implemented by the engine yet; "
        f"use one of {', '.join(SERVED_KV_CACHE_DTYPES)}"
    )


def unserved_quantization_message(choice: str) -> str:
    """Why a deployment with weight quantization `choice` cannot be served, and what to use."""
    return (
        f"weight quantization {choice!r} is not implemented by the engine yet; "
        f"use one of {', '.join(SERVED_WEIGHT_QUANTIZATIONS)}"
    )

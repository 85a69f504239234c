"""Whether a deployment's quantization choice can serve a base model on a device, and if not,
why and what would work. Torch-free: the control plane checks before it stores a deployment,
and the launcher mapping checks again with the replica's device. The platform reads the
choices' names here; they are defined once in `loraplex.loader.quant_choices` (the loader,
below the platform, parses them too).
"""

from __future__ import annotations

from typing import Any

from loraplex.loader.quant_choices import (
    AUTO,
    INT4_CHOICES,
    INT4_GROUP_SIZE,
    KV_CACHE_CHOICES,
    QUANTIZED,
    QUANTIZED_ON_LOAD,
    WEIGHT_CHOICES,
)
from loraplex.platform.engine_spec.prequantized import (
    PREQUANTIZED_WEIGHTS,
    SERVED_AWQ_GPTQ,
    awq_gptq_format,
)

__all__ = [
    "AUTO",
    "INT4_CHOICES",
    "INT4_GROUP_SIZE",
    "KV_CACHE_CHOICES",
    "QUANTIZED_ON_LOAD",
    "QUANTIZED_WEIGHTS",
    "WEIGHT_CHOICES",
    "WEIGHT_DEVICES",
    "QuantizationRefused",
    "check_quantization",
    "checkpoint_choice",
    "compressed_tensors_choice",
    "prequantized_method",
]

QUANTIZED_WEIGHTS = QUANTIZED
WEIGHT_DEVICES = ("cpu", "cuda")
"""Device types the quantized Linear methods run on (packed CPU kernels; dequantizing or
`torch._scaled_mm` paths on CUDA)."""


class QuantizationRefused(ValueError):
    """The choice cannot serve this model or device; the message says why and what would."""


def _linear_in_features(hf_config: dict[str, Any]) -> dict[str, int]:
    hidden = int(hf_config.get("hidden_size", 0))
    heads = int(hf_config.get("num_attention_heads", 0) or 0)
    head_dim = int(hf_config.get("head_dim") or (hidden // heads if heads else 0))
    inter = int(hf_config.get("intermediate_size", 0) or 0)
    dims = {"hidden_size": hidden, "num_attention_heads * head_dim": heads * head_dim}
    if inter:
        dims["intermediate_size"] = inter
    return dims


def prequantized_method(hf_config: dict[str, Any]) -> str | None:
    """The scheme a pre-quantized checkpoint fixes (`quantization_config.quant_method`)."""
    qc = hf_config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    return str(qc.get("quant_method") or qc.get("format") or "unknown")


def compressed_tensors_choice(hf_config: dict[str, Any]) -> str | None:
    """The deployment weight choice a compressed-tensors checkpoint fixes, when the engine
    reads its scheme (int4 pack-quantized g128, int8 per channel or group 128, fp8 per channel
    with dynamic or static per-tensor activation scales); else None."""
    qc = hf_config.get("quantization_config") or {}
    groups = list((qc.get("config_groups") or {}).values())
    if qc.get("quant_method") != "compressed-tensors" or len(groups) != 1:
        return None
    w = groups[0].get("weights") or {}
    fmt = groups[0].get("format") or qc.get("format")
    key = (w.get("type"), w.get("num_bits"), w.get("strategy"), fmt)
    if key == ("int", 4, "group", "pack-quantized") and w.get("group_size") == INT4_GROUP_SIZE:
        return "int4"
    acts = groups[0].get("input_activations") or {}
    static = bool(acts) and acts.get("dynamic") is not True
    if static:  # static input scales: fp8 per-tensor over fp8 per-channel weights only
        fp8_tensor = (acts.get("type"), acts.get("num_bits"), acts.get("strategy"))
        if key != ("float", 8, "channel", "float-quantized") or fp8_tensor != (
            "float", 8, "tensor",
        ):  # fmt: skip
            return None
    if key[:3] == ("int", 8, "channel") and fmt in ("int-quantized", "naive-quantized"):
        return "int8"
    if (
        key[:3] == ("int", 8, "group")
        and w.get("group_size") == 128
        and fmt in ("int-quantized", "naive-quantized", "pack-quantized")
    ):
        return "int8"
    if key == ("float", 8, "channel", "float-quantized"):
        return "fp8"
    return None


def checkpoint_choice(hf_config: dict[str, Any]) -> str | None:
    """The deployment weight choice a pre-quantized checkpoint fixes, when the engine reads
    it (compressed-tensors int4 / int8 / fp8, awq, gptq); else None. NotImplementedError for an
    AWQ / GPTQ checkpoint the engine does not read, saying what it reads."""
    fmt = awq_gptq_format(hf_config)
    return fmt.method if fmt is not None else compressed_tensors_choice(hf_config)


def _unread(method: str, why: str) -> QuantizationRefused:
    return QuantizationRefused(
        f"the base model's checkpoint is pre-quantized ({method}) in a scheme the engine "
        f"does not read{why}; served pre-quantized: compressed-tensors int4 pack-quantized g128, "
        f"int8 per channel or g128, fp8 per channel (dynamic or static input scales); "
        f"{SERVED_AWQ_GPTQ}. Or register the bf16/fp16 checkpoint and "
        "deploy it with weights int8, int4 or fp8"
    )


def check_quantization(
    weights: str, kv_cache: str, hf_config: dict[str, Any], device: str | None = None
) -> None:
    """Raise QuantizationRefused when `weights` / `kv_cache` cannot serve `hf_config` on
    `device` (None: any device the engine supports)."""
    method = prequantized_method(hf_config)
    try:
        fixed = checkpoint_choice(hf_config)
    except NotImplementedError as exc:
        raise _unread(str(method), f" ({exc})") from exc
    if method is not None and fixed is None:
        raise _unread(method, "")
    if weights == AUTO:
        return  # the checkpoint's own scheme, or the device's native compute type
    if fixed is not None and weights != fixed and not (fixed == "int4" and weights in INT4_CHOICES):
        label = method if method == fixed else f"{method} {fixed}"
        raise QuantizationRefused(
            f"the base model's checkpoint is pre-quantized ({label}) and "
            f"fixes its own scheme; deploy it with weights {fixed}"
        )
    if fixed is None and weights in PREQUANTIZED_WEIGHTS:
        raise QuantizationRefused(
            f"weights {weights} serve a checkpoint pre-quantized with {weights.upper()}, but the "
            "base model's checkpoint stores plain (unquantized) weights; use int4 to quantize "
            f"it to 4 bits on load (or int8 / fp8), or register a {weights.upper()} checkpoint"
        )
    if weights in INT4_CHOICES:
        bad = {k: v for k, v in _linear_in_features(hf_config).items() if v % INT4_GROUP_SIZE}
        if bad:
            shown = ", ".join(f"{k}={v}" for k, v in bad.items())
            raise QuantizationRefused(
                f"int4 quantizes in groups of {INT4_GROUP_SIZE} inputs, but {shown} "
                f"{'is' if len(bad) == 1 else 'are'} not a multiple of {INT4_GROUP_SIZE}; "
                "int8 or fp8 would work for this model"
            )
    kind = None if device is None else device.split(":", 1)[0]
    if kind is not None and weights in QUANTIZED_WEIGHTS and kind not in WEIGHT_DEVICES:
        raise QuantizationRefused(
            f"{weights} weights run on {' or '.join(WEIGHT_DEVICES)}, not {kind!r}; "
            "bf16 or fp16 would work there"
        )
    if kind is not None and kv_cache == "fp8" and kind not in WEIGHT_DEVICES:
        raise QuantizationRefused(
            f"the fp8 KV cache runs on {' or '.join(WEIGHT_DEVICES)}, not {kind!r}; "
            "use kv_cache auto there"
        )

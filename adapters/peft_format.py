"""The PEFT LoRA adapter format as-is: `adapter_config.json` and the tensor names inside
`adapter_model.safetensors`, with per-module rank and scale resolution.

Parsing only: which modules the config targets, at what rank and scale, is decided once at
validation by `targets.resolve_targets` (tenant patterns on RE2); replicas never read the
patterns. Module keys are PEFT's, relative to the causal-LM wrapper
(``model.layers.3.self_attn.q_proj``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .expert_targets import unserved_parameter
from .mla_targets import MLA_MODULES, UNSERVED_MLA_MODULES, is_mla_config, mla_module_dims
from .tenant_regex import TenantPatternError, check_pattern

# The projections a LoRA may target, and which block each lives in.
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LORA_MODULES = ATTENTION_MODULES + MLP_MODULES
TARGETABLE_MODULES = LORA_MODULES + MLA_MODULES  # and MLA bases' own attention projections
_BLOCK_OF = {m: "self_attn" for m in ATTENTION_MODULES + MLA_MODULES} | {
    m: "mlp" for m in MLP_MODULES
}

MAX_RANK = 4096
MAX_LAYER_IDX = 100_000

_TENSOR_NAME = re.compile(
    r"base_model\.model\.model\.layers\.(?P<layer>0|[1-9][0-9]{0,5})\."
    r"(?P<block>self_attn|mlp)\.(?P<module>[a-z][a-z_]{0,24}_proj(?:_with_mqa)?)\."
    r"lora_(?P<kind>[AB])(?:\.(?P<adapter>[A-Za-z0-9_\-]{1,64}))?\.weight"
)


class AdapterFormatError(ValueError):
    """An adapter's config or tensors do not follow the supported PEFT LoRA format."""


@dataclass(frozen=True)
class PeftAdapterConfig:
    """The fields of a PEFT LoRA `adapter_config.json` that decide the adapter's math."""

    r: int
    lora_alpha: float
    use_rslora: bool = False
    target_modules: list[str] | str = field(default_factory=list)
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    use_dora: bool = False
    modules_to_save: list[str] | None = None
    base_model_name_or_path: str | None = None
    layers_to_transform: list[int] | None = None
    layers_pattern: list[str] | None = None
    exclude_modules: list[str] | str | None = None
    target_parameters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LoraTensorName:
    """A parsed LoRA tensor name: which layer, which projection, A (down) or B (up)."""

    layer_idx: int
    module: str
    module_path: str
    kind: str


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive_rank(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_RANK:
        raise AdapterFormatError(f"{what} must be an integer in 1..{MAX_RANK}, got {value!r}")
    return value


def _finite_alpha(value: Any, what: str) -> float:
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise AdapterFormatError(f"{what} must be a positive finite number, got {value!r}")
    return float(value)


def _check_regex(pattern: str, what: str) -> None:
    """Refuse a pattern RE2 cannot run or Python's re (PEFT) would read otherwise."""
    try:
        check_pattern(pattern, what)
    except TenantPatternError as exc:
        raise AdapterFormatError(str(exc)) from None


def _str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise AdapterFormatError(f"{what} must be a list of non-empty strings")
    if len(value) > 1024:
        raise AdapterFormatError(f"{what} has too many entries ({len(value)}, at most 1024)")
    return list(value)


def _targets_field(value: Any, what: str) -> list[str] | str:
    if isinstance(value, str):
        if value != "all-linear":
            _check_regex(value, what)
        return value
    names = _str_list(value, what)
    if not names:
        raise AdapterFormatError(f"{what} is empty: the adapter targets no module")
    return sorted(set(names))


def _pattern_dict(value: Any, what: str, check: Callable[[Any, str], Any]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AdapterFormatError(f"{what} must be an object mapping module patterns to values")
    out = {}
    if len(value) > 1024:
        raise AdapterFormatError(f"{what} has too many keys ({len(value)}, at most 1024)")
    for key, v in value.items():
        # Checked as PEFT composes it: a key such as '(?i)q_proj' is invalid there.
        _check_regex(rf"(.*\.)?({key})$", f"{what} key {key!r}")
        out[key] = check(v, f"{what}[{key!r}]")
    return out


def _load_json_object(raw: bytes | str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AdapterFormatError("adapter_config.json is not valid UTF-8") from exc
    if not isinstance(raw, str):
        raise AdapterFormatError(f"adapter config must be JSON bytes or a dict, got {type(raw)}")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise AdapterFormatError(f"adapter_config.json is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise AdapterFormatError("adapter_config.json must hold a JSON object")
    return obj


def _refuse_unsupported(obj: dict[str, Any]) -> None:
    peft_type = obj.get("peft_type", "LORA")
    if peft_type is not None and str(peft_type).upper() != "LORA":
        raise AdapterFormatError(f"peft_type {peft_type!r} is not supported: only LORA adapters")
    if obj.get("use_dora"):
        raise AdapterFormatError("use_dora=true (DoRA adapters) is not supported yet")
    if obj.get("modules_to_save"):
        raise AdapterFormatError(
            "modules_to_save is not supported yet: the adapter may only carry LoRA A/B matrices"
        )
    if obj.get("lora_bias"):
        raise AdapterFormatError("lora_bias=true (a bias on lora_B) is not supported yet")
    if obj.get("layer_replication"):
        raise AdapterFormatError("layer_replication is not supported yet")
    if obj.get("trainable_token_indices"):
        raise AdapterFormatError("trainable_token_indices is not supported yet")
    if obj.get("fan_in_fan_out"):
        raise AdapterFormatError("fan_in_fan_out=true is not supported (Llama-style Linear only)")


def parse_adapter_config(raw: bytes | str | dict[str, Any]) -> PeftAdapterConfig:
    """Parse and check a PEFT `adapter_config.json` (bytes, text or an already-decoded dict).

    Raises AdapterFormatError with a message fit to show the uploader.
    """
    obj = _load_json_object(raw)
    _refuse_unsupported(obj)
    if "r" not in obj:
        raise AdapterFormatError("adapter_config.json is missing 'r' (the LoRA rank)")
    r = _positive_rank(obj["r"], "r")
    if "lora_alpha" not in obj:
        raise AdapterFormatError("adapter_config.json is missing 'lora_alpha'")
    alpha = _finite_alpha(obj["lora_alpha"], "lora_alpha")
    use_rslora = obj.get("use_rslora", False)
    if not isinstance(use_rslora, bool):
        raise AdapterFormatError(f"use_rslora must be true or false, got {use_rslora!r}")
    params = _target_parameters(obj.get("target_parameters"))
    if obj.get("target_modules") in (None, []) and params:
        targets: list[str] | str = []
    elif obj.get("target_modules") is None:
        raise AdapterFormatError("adapter_config.json is missing 'target_modules'")
    else:
        targets = _targets_field(obj["target_modules"], "target_modules")
    rank_pattern = _pattern_dict(obj.get("rank_pattern"), "rank_pattern", _positive_rank)
    alpha_pattern = _pattern_dict(obj.get("alpha_pattern"), "alpha_pattern", _finite_alpha)

    layers = obj.get("layers_to_transform")
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if layers is not None and (
        not isinstance(layers, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)
    ):
        raise AdapterFormatError("layers_to_transform must be a non-negative integer or a list")
    layers_pattern = obj.get("layers_pattern")
    if isinstance(layers_pattern, str):
        layers_pattern = [layers_pattern] if layers_pattern else None
    if layers_pattern is not None:
        layers_pattern = _str_list(layers_pattern, "layers_pattern") or None
        for pattern in layers_pattern or []:
            _check_regex(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", f"layers_pattern {pattern!r}")
    exclude = obj.get("exclude_modules")
    if exclude is not None:
        exclude = _targets_field(exclude, "exclude_modules") if exclude != [] else None

    base = obj.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise AdapterFormatError("base_model_name_or_path must be a string")
    return PeftAdapterConfig(
        r=r,
        lora_alpha=alpha,
        use_rslora=use_rslora,
        target_modules=targets,
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        use_dora=False,
        modules_to_save=None,
        base_model_name_or_path=base,
        layers_to_transform=layers or None,
        layers_pattern=layers_pattern,
        exclude_modules=exclude,
        target_parameters=params,
    )


def _target_parameters(value: Any) -> list[str]:
    """PEFT `target_parameters`: only the MoE experts' fused tensors and the router are served."""
    if value in (None, []):
        return []
    entries = _str_list(value, "target_parameters")
    bad = unserved_parameter(entries)
    if bad is not None:
        raise AdapterFormatError(
            f"target_parameters entry {bad!r} is not served: LoRA on raw parameters is served "
            "for a MoE base's mlp.experts.gate_up_proj, mlp.experts.down_proj and mlp.gate.weight"
        )
    return sorted(set(entries))


def module_path(layer: int, module: str) -> str:
    """PEFT's name of projection `module` in decoder layer `layer` (model.layers.3.mlp.up_proj)."""
    return f"model.layers.{layer}.{_BLOCK_OF[module]}.{module}"


def parse_lora_tensor_name(name: str) -> LoraTensorName:
    """Parse `base_model.model.model.layers.{i}.{self_attn|mlp}.{x}_proj.lora_{A|B}[.name].weight`."""
    if not isinstance(name, str) or len(name) > 256:
        raise AdapterFormatError(f"unexpected tensor name {str(name)[:80]!r}")
    m = _TENSOR_NAME.fullmatch(name)
    if m is None:
        raise AdapterFormatError(
            f"unexpected tensor name {name!r}: expected "
            "base_model.model.model.layers.<i>.<self_attn|mlp>.<proj>.lora_<A|B>.weight"
        )
    module, block = m["module"], m["block"]
    if module in UNSERVED_MLA_MODULES:
        raise AdapterFormatError(
            f"tensor {name!r}: LoRA on {module} is not served ({UNSERVED_MLA_MODULES[module]})"
        )
    if _BLOCK_OF.get(module) != block:
        raise AdapterFormatError(
            f"unexpected tensor name {name!r}: {module} is not a LoRA target under {block} "
            f"(supported: {', '.join(TARGETABLE_MODULES)})"
        )
    layer = int(m["layer"])
    return LoraTensorName(
        layer_idx=layer,
        module=module,
        module_path=module_path(layer, module),
        kind=m["kind"],
    )


def is_moe_config(hf_config: dict[str, Any]) -> bool:
    """True for mixture-of-experts configs (Mixtral, Qwen-MoE, DeepSeek-style)."""
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        value = hf_config.get(key)
        if isinstance(value, int) and value > 0:
            return True
    return False


def module_dims(hf_config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each LoRA-targetable projection of a HF decoder config.

    MoE configs give the attention projections only: their experts and router are targets of
    their own (`expert_targets`), the dense MLP names do not apply there. MLA bases (DeepSeek)
    give their own attention projections (`mla_targets`).
    """
    if is_mla_config(hf_config):
        try:
            return mla_module_dims(hf_config)
        except (KeyError, TypeError, ValueError) as exc:
            raise AdapterFormatError(f"base model config lacks a usable {exc}") from exc
    try:
        hidden = int(hf_config["hidden_size"])
        heads = int(hf_config["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AdapterFormatError(f"base model config lacks a usable {exc}") from exc
    kv_heads = int(hf_config.get("num_key_value_heads") or heads)
    head_dim = int(hf_config.get("head_dim") or hidden // heads)
    dims = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
    if not is_moe_config(hf_config):
        inter = int(hf_config["intermediate_size"])
        dims |= {
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
    return dims

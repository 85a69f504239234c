"""Map HuggingFace checkpoint tensors onto the engine's modules, fusing stacked projections.

Order of routing for one checkpoint name:
1. the deepest module on its path that defines `load_hf_weight(rel_name, tensor) -> list[str]`
   takes it (MoE blocks use this for expert layouts); it returns the parameter names it filled,
   relative to itself;
2. `q_proj`/`k_proj`/`v_proj` go into `qkv_proj`, `gate_proj`/`up_proj` into `gate_up_proj`;
3. anything else is copied into the parameter of the same name.
Unknown names and parameters left unloaded are errors, so a wrong mapping can never go unnoticed.
Before all of these, an fp8 KV cache's scales (`self_attn.k_scale` / `v_scale`, or the older
`self_attn.k_proj.output_scale` / `v_proj.output_scale`; one value or one per KV head) go to
the layer's `Attention.kv_scales`; a float cache never reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
from torch import nn

from loraplex.platform.engine.layers.attention import Attention
from loraplex.platform.engine.layers.linear import Linear

STACKED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
KV_SCALE_SUFFIXES = {
    "k_scale": "k",
    "v_scale": "v",
    "k_proj.output_scale": "k",
    "v_proj.output_scale": "v",
}


class WeightLoadingError(ValueError):
    """The checkpoint does not fit the model (unknown, missing or mis-shaped tensors)."""


HfWeightHook = Callable[[str, torch.Tensor], Iterable[str]]


def _find_delegate(model: nn.Module, name: str) -> tuple[HfWeightHook, str, str] | None:
    """The deepest module on `name`'s path with a `load_hf_weight` hook: (hook, rel, prefix)."""
    parts = name.split(".")
    module: nn.Module = model
    found: tuple[HfWeightHook, str, str] | None = None
    for i, part in enumerate(parts[:-1]):
        child = module._modules.get(part)
        if child is None:
            break
        module = child
        hook = getattr(module, "load_hf_weight", None)
        if callable(hook):
            found = (hook, ".".join(parts[i + 1 :]), ".".join(parts[: i + 1]))
    return found


def _load_kv_scale(modules: dict[str, nn.Module], name: str, tensor: torch.Tensor) -> bool:
    """Route a checkpoint KV-cache scale to its attention layer; False if `name` is not one."""
    for suffix, which in KV_SCALE_SUFFIXES.items():
        if name.endswith(f"self_attn.{suffix}"):
            attn = modules.get(name[: -len(suffix)] + "attn")
            if not isinstance(attn, Attention):
                raise WeightLoadingError(f"KV scale {name!r} has no attention layer")
            scale = tensor.detach().float().reshape(-1).clone()
            if scale.numel() not in (1, attn.num_kv_heads) or not bool((scale > 0).all()):
                raise WeightLoadingError(
                    f"{name}: a KV scale needs 1 or {attn.num_kv_heads} positive values, "
                    f"got shape {tuple(tensor.shape)}"
                )
            attn.kv_scales = replace(attn.kv_scales, **{which: scale})
            return True
    return False


def load_hf_weights(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], *, skip_lm_head: bool
) -> None:
    """Load every (name, tensor) into `model`; raise WeightLoadingError on any mismatch."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    # parameter name -> slices still waiting for data ("" for an unsliced parameter)
    pending: dict[str, set[str]] = {name: {""} for name in params}
    for mod_name, mod in modules.items():
        if isinstance(mod, Linear):
            for piece in (*mod.sliced_params, *mod.shared_params):
                if f"{mod_name}.{piece}" in pending:
                    pending[f"{mod_name}.{piece}"] = set(mod.slice_names)

    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES):
            continue
        if skip_lm_head and name == "lm_head.weight":
            continue
        if _load_kv_scale(modules, name, tensor):
            continue
        delegate = _find_delegate(model, name)
        if delegate is not None:
            hook, rel, prefix = delegate
            for rel_param in hook(rel, tensor):
                pending.pop(f"{prefix}.{rel_param}", None)
            continue
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in STACKED:
            fused = ".".join([*parts[:-2], STACKED[parts[-2]]])
            module = modules.get(fused)
            if not isinstance(module, Linear):
                raise WeightLoadingError(f"checkpoint tensor {name!r} has no place in the model")
            try:
                module.load_slice(parts[-2], tensor, piece=parts[-1])
            except (KeyError, ValueError) as exc:
                raise WeightLoadingError(f"{name}: {exc}") from exc
            pending.get(f"{fused}.{parts[-1]}", set()).discard(parts[-2])
            continue
        param = params.get(name)
        if param is None:
            raise WeightLoadingError(f"checkpoint tensor {name!r} has no place in the model")
        if tuple(param.shape) != tuple(tensor.shape):
            raise WeightLoadingError(
                f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}"
            )
        if param.dtype != tensor.dtype and not (
            param.is_floating_point() and tensor.is_floating_point()
        ):
            raise WeightLoadingError(f"{name}: checkpoint dtype {tensor.dtype} != {param.dtype}")
        with torch.no_grad():
            param.copy_(tensor)
        pending.pop(name, None)

    missing = sorted(f"{p}[{s}]" if s else p for p, slices in pending.items() for s in slices)
    if missing:
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise WeightLoadingError(f"checkpoint lacks {len(missing)} tensor(s): {shown}")
    for mod in modules.values():
        if isinstance(mod, Linear):
            mod.finish_loading()


def quantized_linear_inputs(model: nn.Module) -> dict[str, int]:
    """Checkpoint prefixes (`model.layers.0.self_attn.q_proj.`) of the linear weights `model`
    stores quantized, q/k/v of a fused qkv_proj by their own names, with their in_features."""
    found: dict[str, int] = {}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, Linear) and mod.quant_method is not None:
            if len(mod.slice_names) == 1 and mod_name.endswith(mod.slice_names[0]):
                found[f"{mod_name}."] = mod.in_features
                continue
            parent = mod_name.rsplit(".", 1)[0] + "." if "." in mod_name else ""
            for slice_name in mod.slice_names:
                found[f"{parent}{slice_name}."] = mod.in_features
    return found


def quantized_weight_names(model: nn.Module) -> set[str]:
    """The checkpoint names of the linear weights `model` stores quantized, so the loader
    quantizes exactly those."""
    return {f"{prefix}weight" for prefix in quantized_linear_inputs(model)}

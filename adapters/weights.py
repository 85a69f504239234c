"""Load a PEFT LoRA adapter (a directory or its two files' bytes) into per-module A, B and scale,
checked tensor by tensor against the base model's dimensions.

The result is host-resident and keyed by the adapter *version* (sha256 of its bytes), which is
what every cache above this one is keyed by: re-uploading a name yields a new key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from loraplex.adapters.expert_targets import EXPERT_MODULES, moe_shape
from loraplex.adapters.expert_tensors import classify
from loraplex.adapters.expert_weights import ExpertLoraModule, ExpertPairs, build_expert_modules
from loraplex.adapters.peft_format import (
    AdapterFormatError,
    module_dims,
    parse_adapter_config,
    parse_lora_tensor_name,
)
from loraplex.adapters.targets import ResolvedTargets, keep_present, resolve_config_targets

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class ModuleLora:
    """One targeted projection: A [r, in], B [out, r] and the delta's scale."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        """The module's LoRA rank."""
        return int(self.a.shape[0])


@dataclass(frozen=True)
class LoadedAdapter:
    """A validated adapter version in host memory, keyed by its sha256."""

    key: str
    targets: ResolvedTargets
    modules: dict[tuple[int, str], ModuleLora]
    experts: dict[int, ExpertLoraModule] = field(default_factory=dict)  # by MoE layer

    @property
    def max_rank(self) -> int:
        """The largest rank over its modules and expert targets (what the pool must hold)."""
        ranks = [m.rank for m in self.modules.values()] + [x.rank for x in self.experts.values()]
        return max(ranks)

    @property
    def nbytes(self) -> int:
        """Host bytes its tensors take."""
        return sum(
            m.a.numel() * m.a.element_size() + m.b.numel() * m.b.element_size()
            for m in self.modules.values()
        ) + sum(x.nbytes for x in self.experts.values())


def adapter_version_key(config_bytes: bytes, weights_bytes: bytes) -> str:
    """The version identity of an adapter: sha256 over both files (length-prefixed)."""
    h = hashlib.sha256()
    for part in (config_bytes, weights_bytes):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def read_adapter_dir(path: str | Path, max_bytes: int | None = None) -> tuple[bytes, bytes]:
    """Read `adapter_config.json` and `adapter_model.safetensors` from a directory.

    Pickled weights (`adapter_model.bin`) are refused: they can run code when loaded.
    """
    root = Path(path)
    if not root.is_dir():
        raise AdapterFormatError(f"adapter directory {str(root)!r} does not exist")
    cfg, weights = root / CONFIG_FILE, root / WEIGHTS_FILE
    if not cfg.is_file():
        raise AdapterFormatError(f"{str(root)!r} has no {CONFIG_FILE}")
    if not weights.is_file():
        if (root / "adapter_model.bin").exists():
            raise AdapterFormatError(
                "adapter_model.bin (pickle) is refused: convert it to adapter_model.safetensors"
            )
        raise AdapterFormatError(f"{str(root)!r} has no {WEIGHTS_FILE}")
    if max_bytes is not None and weights.stat().st_size > max_bytes:
        raise AdapterFormatError(
            f"{WEIGHTS_FILE} is {weights.stat().st_size} bytes, over the limit of {max_bytes}"
        )
    return cfg.read_bytes(), weights.read_bytes()


def _check_tensor(name: str, t: torch.Tensor, shape: tuple[int, int]) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise AdapterFormatError(f"{name}: dtype {t.dtype} is not float32, float16 or bfloat16")
    if tuple(t.shape) != shape:
        raise AdapterFormatError(f"{name}: shape {tuple(t.shape)} != expected {shape}")
    if not bool(torch.isfinite(t).all()):
        raise AdapterFormatError(f"{name}: holds NaN or infinite values")


def _collect(
    tensors: dict[str, torch.Tensor],
) -> dict[tuple[int, str], dict[str, tuple[str, torch.Tensor, str]]]:
    found: dict[tuple[int, str], dict[str, tuple[str, torch.Tensor, str]]] = {}
    for name, t in tensors.items():
        info = parse_lora_tensor_name(name)
        slot = found.setdefault((info.layer_idx, info.module), {})
        if info.kind in slot:
            raise AdapterFormatError(f"{name}: a second lora_{info.kind} for {info.module_path}")
        slot[info.kind] = (name, t, info.module_path)
    return found


def load_adapter(
    config_bytes: bytes,
    weights_bytes: bytes,
    hf_config: dict[str, Any],
    *,
    targets: ResolvedTargets | None = None,
    key: str | None = None,
    max_rank: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedAdapter:
    """Check an adapter's tensors against its targets and the base model; materialise them.

    `targets` are the version's resolved targets (what validation stored): a replica always
    passes them, so it never reads the config's patterns. Without them (a local adapter
    directory) they are resolved here, on RE2, from the config. `key` defaults to the sha256
    of both files. Raises AdapterFormatError on any mismatch.
    """
    params: list[str] = []  # a replica's stored targets were checked at validation
    if targets is None:
        targets = resolve_config_targets(config_bytes, hf_config)
        params = parse_adapter_config(config_bytes).target_parameters
    dims = module_dims(hf_config)
    num_layers = int(hf_config["num_hidden_layers"])
    try:
        tensors = load_safetensors(bytes(weights_bytes))
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise AdapterFormatError(f"{WEIGHTS_FILE} is not a valid safetensors file: {exc}") from exc
    if not tensors:
        raise AdapterFormatError(f"{WEIGHTS_FILE} holds no tensors")

    experts, present = _expert_pairs(tensors, targets, hf_config)
    targets = keep_present(targets, present, params)
    found = _collect(tensors)
    modules: dict[tuple[int, str], ModuleLora] = {}
    for (layer, module), parts in sorted(found.items()):
        module_path = next(iter(parts.values()))[2]
        if layer >= num_layers:
            raise AdapterFormatError(f"{module_path}: the base model has {num_layers} layers")
        if module not in dims:
            raise AdapterFormatError(f"{module_path}: {module} is not a LoRA target of this model")
        target = targets.get(layer, module)
        if target is None:
            raise AdapterFormatError(f"{module_path} has weights but target_modules excludes it")
        for kind in ("A", "B"):
            if kind not in parts:
                raise AdapterFormatError(f"{module_path}: lora_{kind} is missing")
        r = target.rank
        if max_rank is not None and r > max_rank:
            raise AdapterFormatError(f"{module_path}: rank {r} exceeds max_lora_rank {max_rank}")
        d_in, d_out = dims[module]
        name_a, a, _ = parts["A"]
        name_b, b, _ = parts["B"]
        _check_tensor(name_a, a, (r, d_in))
        _check_tensor(name_b, b, (d_out, r))
        modules[(layer, module)] = ModuleLora(
            a=a.to(dtype).contiguous(), b=b.to(dtype).contiguous(), scale=target.scale
        )
    for layer, module in sorted(targets.modules):
        if module in EXPERT_MODULES:
            _check_expert_complete(experts, layer, module, hf_config)
        elif (layer, module) not in modules:
            raise AdapterFormatError(
                f"layer {layer} {module} is targeted but the adapter has no weights for it"
            )
    shape = moe_shape(hf_config)
    return LoadedAdapter(
        key=key or adapter_version_key(config_bytes, weights_bytes),
        targets=targets,
        modules=modules,
        experts=build_expert_modules(experts, targets, shape, dtype) if experts else {},  # type: ignore[arg-type]  # expert weights imply an MoE shape
    )


def _expert_pairs(
    tensors: dict[str, torch.Tensor], targets: ResolvedTargets, hf_config: dict[str, Any]
) -> tuple[ExpertPairs, set[tuple[int, str]]]:
    """Pop the expert/router tensors out of `tensors`, checked: (layer, target, expert) -> A/B."""
    shape = moe_shape(hf_config)
    pairs: ExpertPairs = {}
    for name in list(tensors):
        hit = classify(name, targets, shape)
        if hit is None:
            continue
        t = tensors.pop(name)
        _check_tensor(name, t, hit.shape)
        p = hit.parsed
        slot = pairs.setdefault((p.layer_idx, p.module, p.expert), {})
        if p.kind in slot:
            raise AdapterFormatError(f"{name}: a second lora_{p.kind} for {hit.path}")
        slot[p.kind] = t
    for (layer, module, expert), slot in pairs.items():
        for kind in ("A", "B"):
            if kind not in slot:
                where = module if expert is None else f"{module} expert {expert}"
                raise AdapterFormatError(f"layer {layer} {where}: lora_{kind} is missing")
    return pairs, {(layer, module) for layer, module, _ in pairs}


def _check_expert_complete(
    pairs: ExpertPairs, layer: int, module: str, hf_config: dict[str, Any]
) -> None:
    """Every expert (or the one fused / router pair) of a targeted expert module is there."""
    shape = moe_shape(hf_config)
    experts = range(shape.num_experts) if module.startswith("per_expert.") else [None]  # type: ignore[union-attr]  # per-expert modules imply an MoE shape
    for expert in experts:
        if (layer, module, expert) not in pairs:
            where = module if expert is None else f"{module} expert {expert}"
            raise AdapterFormatError(
                f"layer {layer} {where} is targeted but the adapter has no weights for it"
            )


def load_adapter_dir(
    path: str | Path,
    hf_config: dict[str, Any],
    *,
    max_rank: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedAdapter:
    """`read_adapter_dir` then `load_adapter`, keyed by the files' sha256."""
    cfg_bytes, weights_bytes = read_adapter_dir(path)
    return load_adapter(cfg_bytes, weights_bytes, hf_config, max_rank=max_rank, dtype=dtype)

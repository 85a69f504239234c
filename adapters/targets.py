"""An adapter's targets resolved once, at validation: which modules, with what rank and scale.

`resolve_targets` applies PEFT's matching rules (`target_modules`, `exclude_modules`,
`layers_to_transform` / `layers_pattern`, `rank_pattern`, `alpha_pattern`, rsLoRA) to the base
model's finite list of LoRA-targetable module names, running every tenant pattern on RE2
(`tenant_regex`). The result, `ResolvedTargets`, is stored with the version and handed to
replicas inside the adapter reference; replicas read it (`from_json`, no regex at all) and
never see a tenant pattern.

PEFT's rules, as in peft's `check_target_module_exists` and `get_pattern_key`:
- `target_modules` as a string: full match of the module name; no layer filter.
- as a list: the name itself, or any name ending in `.<entry>`; a suffix match (not an exact
  name) is then filtered by `layers_to_transform`, the layer index being the number after
  the first `layers_pattern` match (or the first numbered segment without one).
- `exclude_modules` is checked first, the same way (string: full match; list: suffix).
- rank/alpha: the first pattern key (in the config's order) with `(.*\\.)?(KEY)$` matching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .expert_targets import (
    EXPERT_MODULES,
    PER_EXPERT_MODULES,
    ROUTER_MODULE,
    SHARED_MODULES,
    moe_shape,
    param_key,
    param_targets,
    per_expert_keys,
    router_keys,
    shared_keys,
)
from .peft_format import (
    MAX_LAYER_IDX,
    MAX_RANK,
    TARGETABLE_MODULES,
    AdapterFormatError,
    PeftAdapterConfig,
    module_dims,
    module_path,
)
from .tenant_regex import TenantPatternError, compile_pattern

FORMAT_VERSION = 1
_KNOWN_MODULES = TARGETABLE_MODULES + EXPERT_MODULES
# Expert / router targets a `target_modules` pattern may match without the weights having them
# (a transformers v5 base has no per-expert Linear): kept only where the tensors are present.
OPTIONAL_MODULES = PER_EXPERT_MODULES + (ROUTER_MODULE,) + SHARED_MODULES
MAX_RESOLVED_MODULES = 200_000


@dataclass(frozen=True)
class ModuleTarget:
    """One targeted projection's LoRA rank, alpha and the delta's scale."""

    rank: int
    alpha: float
    scale: float


@dataclass(frozen=True)
class ResolvedTargets:
    """Every module an adapter version targets, keyed by (layer index, projection name)."""

    modules: dict[tuple[int, str], ModuleTarget] = field(default_factory=dict)

    def get(self, layer: int, module: str) -> ModuleTarget | None:
        """The target at (`layer`, `module`), or None when the adapter leaves it alone."""
        return self.modules.get((layer, module))

    @property
    def max_rank(self) -> int:
        """The largest rank over the targeted modules (0 when none)."""
        return max((t.rank for t in self.modules.values()), default=0)

    @property
    def projections(self) -> list[str]:
        """The targeted projection names (q_proj, ...), sorted."""
        return sorted({m for _, m in self.modules})

    def to_json(self) -> dict[str, Any]:
        """Compact JSON: modules grouped by (rank, alpha, scale), layers listed per projection."""
        groups: dict[tuple[int, float, float], dict[str, list[int]]] = {}
        for (layer, module), t in sorted(self.modules.items()):
            groups.setdefault((t.rank, t.alpha, t.scale), {}).setdefault(module, []).append(layer)
        return {
            "format": FORMAT_VERSION,
            "groups": [
                {"rank": r, "alpha": a, "scale": s, "layers": layers}
                for (r, a, s), layers in sorted(groups.items())
            ],
        }

    @classmethod
    def from_json(cls, obj: Any) -> ResolvedTargets:
        """Read `to_json` output (it comes from the network: every field is checked)."""
        if not isinstance(obj, dict) or obj.get("format") != FORMAT_VERSION:
            raise AdapterFormatError(
                f"resolved targets must be an object with format {FORMAT_VERSION}"
            )
        groups = obj.get("groups")
        if not isinstance(groups, list) or not groups:
            raise AdapterFormatError("resolved targets must list at least one group")
        modules: dict[tuple[int, str], ModuleTarget] = {}
        for group in groups:
            target = _group_target(group)
            layers = group.get("layers")
            if not isinstance(layers, dict) or not layers:
                raise AdapterFormatError("a resolved-targets group needs its layers by projection")
            for module, idxs in layers.items():
                if module not in _KNOWN_MODULES or not isinstance(idxs, list):
                    raise AdapterFormatError(f"resolved targets name an unknown module {module!r}")
                for i in idxs:
                    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_LAYER_IDX:
                        raise AdapterFormatError(f"resolved targets have a bad layer index {i!r}")
                    if (i, module) in modules:
                        raise AdapterFormatError(f"resolved targets list layer {i} {module} twice")
                    modules[(i, module)] = target
                    if len(modules) > MAX_RESOLVED_MODULES:
                        raise AdapterFormatError("resolved targets list too many modules")
        return cls(modules)


def _group_target(group: Any) -> ModuleTarget:
    if not isinstance(group, dict):
        raise AdapterFormatError("a resolved-targets group must be an object")
    rank, alpha, scale = group.get("rank"), group.get("alpha"), group.get("scale")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 < rank <= MAX_RANK:
        raise AdapterFormatError(f"resolved targets have a bad rank {rank!r}")
    return ModuleTarget(rank, _positive("alpha", alpha), _positive("scale", scale))


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AdapterFormatError(f"resolved targets have a bad {name} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise AdapterFormatError(f"resolved targets have a bad {name} {value!r}")
    return float(value)


def module_paths(hf_config: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(layer, projection, PEFT module name) of every LoRA-targetable module of the base model."""
    dims = module_dims(hf_config)
    try:
        layers = int(hf_config["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AdapterFormatError(f"base model config lacks a usable {exc}") from exc
    if not 0 < layers <= MAX_LAYER_IDX:
        raise AdapterFormatError(f"base model has an unusable num_hidden_layers {layers}")
    return [
        (i, m, module_path(i, m)) for i in range(layers) for m in TARGETABLE_MODULES if m in dims
    ]


class _Matchers:
    """The config's tenant patterns, each compiled once by RE2 (refused here if unsafe)."""

    def __init__(self, cfg: PeftAdapterConfig) -> None:
        self.cfg = cfg
        self.target = (
            compile_pattern(cfg.target_modules, "target_modules")
            if isinstance(cfg.target_modules, str) and cfg.target_modules != "all-linear"
            else None
        )
        self.exclude = (
            compile_pattern(cfg.exclude_modules, "exclude_modules")
            if isinstance(cfg.exclude_modules, str)
            else None
        )
        self.layers = [
            compile_pattern(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", f"layers_pattern {p!r}")
            for p in cfg.layers_pattern or []
        ]
        self.first_index = compile_pattern(r".*?\.[^.]*\.(?P<idx>\d+)\.", "layer index")
        self.rank = _pattern_keys(cfg.rank_pattern, "rank_pattern")
        self.alpha = _pattern_keys(cfg.alpha_pattern, "alpha_pattern")

    def excluded(self, key: str) -> bool:
        spec = self.cfg.exclude_modules
        if not spec:
            return False
        if self.exclude is not None:
            return self.exclude.fullmatch(key) is not None
        return _in_list(list(spec), key)

    def layer_index(self, key: str) -> int | None:
        found = None
        for regex in self.layers or [self.first_index]:
            found = regex.match(key)
            if found is not None:
                break
        idx = found.groupdict().get("idx") if found is not None else None
        return int(idx) if idx is not None else None

    def targeted(self, key: str) -> bool:
        if self.excluded(key):
            return False
        if self.target is not None:
            return self.target.fullmatch(key) is not None
        all_linear = self.cfg.target_modules == "all-linear"
        names = TARGETABLE_MODULES if all_linear else self.cfg.target_modules
        if key in names:
            return True
        if not any(key.endswith("." + n) for n in names):
            return False
        wanted = self.cfg.layers_to_transform
        return not wanted or self.layer_index(key) in wanted


def _in_list(names: list[str], key: str) -> bool:
    return key in names or any(key.endswith("." + n) for n in names)


def _pattern_keys(patterns: dict[str, Any], what: str) -> list[tuple[Any, Any]]:
    return [
        (compile_pattern(rf"(.*\.)?({key})$", f"{what} key {key!r}"), value)
        for key, value in patterns.items()
    ]


def _first(keys: list[tuple[Any, Any]], key: str, default: Any) -> Any:
    for regex, value in keys:
        if regex.match(key) is not None:
            return value
    return default


def resolve_targets(cfg: PeftAdapterConfig, hf_config: dict[str, Any]) -> ResolvedTargets:
    """Apply the config's PEFT rules to the base model's module names (every pattern on RE2).

    Raises AdapterFormatError (a TenantPatternError for a refused pattern) with a message fit
    for the uploader.
    """
    try:
        matchers = _Matchers(cfg)
    except TenantPatternError as exc:
        raise AdapterFormatError(str(exc)) from None
    modules: dict[tuple[int, str], ModuleTarget] = {}
    for layer, module, key in module_paths(hf_config):
        if not matchers.targeted(key):
            continue
        r = int(_first(matchers.rank, key, cfg.r))
        alpha = float(_first(matchers.alpha, key, cfg.lora_alpha))
        scale = alpha / math.sqrt(r) if cfg.use_rslora else alpha / r
        modules[(layer, module)] = ModuleTarget(r, alpha, scale)
    _resolve_expert_targets(cfg, matchers, hf_config, modules)
    return ResolvedTargets(modules)


def _target(cfg: PeftAdapterConfig, matchers: _Matchers, key: str) -> ModuleTarget:
    r = int(_first(matchers.rank, key, cfg.r))
    alpha = float(_first(matchers.alpha, key, cfg.lora_alpha))
    return ModuleTarget(r, alpha, alpha / math.sqrt(r) if cfg.use_rslora else alpha / r)


def _resolve_expert_targets(
    cfg: PeftAdapterConfig,
    matchers: _Matchers,
    hf_config: dict[str, Any],
    modules: dict[tuple[int, str], ModuleTarget],
) -> None:
    """Add the experts' and router's targets of a MoE base (see `expert_targets`)."""
    shape = moe_shape(hf_config)
    if shape is None:
        if cfg.target_parameters:
            raise AdapterFormatError(
                "target_parameters (LoRA on a MoE base's expert tensors or router) needs a "
                "mixture-of-experts base model; this base is dense"
            )
        return
    for layer in sorted(shape.sparse_layers):
        params = param_targets(cfg.target_parameters, layer)
        for module in params:
            modules[(layer, module)] = _target(cfg, matchers, param_key(layer, module))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            found = [
                next(
                    (k for k in per_expert_keys(shape, layer, e, proj) if matchers.targeted(k)),
                    None,
                )
                for e in range(shape.num_experts)
            ]
            if all(k is None for k in found):
                continue
            if any(k is None for k in found):
                raise AdapterFormatError(
                    f"target_modules picks {proj} of some experts of layer {layer} but not all: "
                    "LoRA on a subset of a layer's experts is not served"
                )
            each = {_target(cfg, matchers, k) for k in found}  # type: ignore[arg-type]  # no None left (above)
            if len(each) > 1:
                raise AdapterFormatError(
                    f"rank_pattern/alpha_pattern give the experts of layer {layer} {proj} "
                    "different ranks or alphas: not served (one rank per layer's experts)"
                )
            fused = f"experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
            if fused in params:
                raise AdapterFormatError(
                    f"layer {layer} targets the experts' {fused} both as a parameter and per "
                    f"expert ({proj}): choose one layout"
                )
            modules[(layer, f"per_expert.{proj}")] = each.pop()
        if ROUTER_MODULE not in params:
            key = next((k for k in router_keys(layer) if matchers.targeted(k)), None)
            if key is not None:
                modules[(layer, ROUTER_MODULE)] = _target(cfg, matchers, key)
        for module, key in shared_keys(shape, layer).items():
            if matchers.targeted(key):
                modules[(layer, module)] = _target(cfg, matchers, key)
    if cfg.target_parameters and not any(m in EXPERT_MODULES for _, m in modules):
        raise AdapterFormatError(
            f"target_parameters {cfg.target_parameters!r} match no expert tensor of this base"
        )


def keep_present(
    targets: ResolvedTargets, present: set[tuple[int, str]], params: list[str] | None = None
) -> ResolvedTargets:
    """Drop optional expert/router targets (module layout) the weights have no tensors for; a
    router that `params` (the config's `target_parameters`) names stays required."""
    entries = params or []

    def required(layer: int, module: str) -> bool:
        return module == ROUTER_MODULE and ROUTER_MODULE in param_targets(entries, layer)

    return ResolvedTargets(
        {
            k: t
            for k, t in targets.modules.items()
            if k[1] not in OPTIONAL_MODULES or k in present or required(*k)
        }
    )


def resolve_config_targets(
    config: bytes | str | dict[str, Any], hf_config: dict[str, Any]
) -> ResolvedTargets:
    """`resolve_targets` of an `adapter_config.json` (bytes, text or dict) for this base."""
    from .peft_format import parse_adapter_config

    return resolve_targets(parse_adapter_config(config), hf_config)

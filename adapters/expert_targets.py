"""LoRA on a MoE base's experts and router: the targets, tensor names and shapes PEFT writes.

Two layouts, one meaning (a per-expert low-rank delta on the expert MLP weights):
- fused, transformers v5's 3-D expert tensors targeted with PEFT `target_parameters`
  (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`): one `lora_A` [r x E, in] and one
  `lora_B` [out, r x E] per tensor (expert e's A is rows e*r..e*r+r; its B the columns
  e, e+E, e+2E, ...). Two targeted parameters of one module nest: the first in the module's
  parameter order (gate_up_proj) is the inner wrapper (`experts.base_layer.lora_A`).
- per expert, older checkpoints with one Linear per expert
  (`experts.{e}.gate_proj|up_proj|down_proj`, Mixtral's `block_sparse_moe.experts.{e}.w1|w3|w2`),
  targeted with `target_modules`.
The router (`mlp.gate`, [E, hidden]) is targeted either way (`mlp.gate.weight` as a parameter,
or `gate` as a module): `lora_A` [r, hidden], `lora_B` [E, r]. Qwen2-MoE's shared expert
(`mlp.shared_expert.gate_proj|up_proj|down_proj`) and its gate (`mlp.shared_expert_gate`,
[1, hidden]) are plain Linears PEFT targets as modules (what `all-linear` picks there).

Target names in `ResolvedTargets`: `experts.gate_up_proj`, `experts.down_proj` (fused),
`per_expert.gate_proj|up_proj|down_proj` (one target for all experts of a layer), `router`,
`shared_expert.gate_proj|up_proj|down_proj` and `shared_expert_gate`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

FUSED_MODULES = ("experts.gate_up_proj", "experts.down_proj")
PER_EXPERT_MODULES = ("per_expert.gate_proj", "per_expert.up_proj", "per_expert.down_proj")
ROUTER_MODULE = "router"
SHARED_MODULES = (
    "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj",
    "shared_expert_gate",
)  # fmt: skip
EXPERT_MODULES = FUSED_MODULES + PER_EXPERT_MODULES + (ROUTER_MODULE,) + SHARED_MODULES

_LEGACY = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_ADAPTER = r"(?:\.[A-Za-z0-9_\-]{1,64})?"
_LAYER = r"base_model\.model\.model\.layers\.(?P<layer>0|[1-9][0-9]{0,5})\."
_FUSED_NAME = re.compile(
    _LAYER
    + r"mlp\.experts\.(?P<nest>(?:base_layer\.){0,1})lora_(?P<kind>[AB])"
    + _ADAPTER
    + r"\.weight"
)
_PER_EXPERT_NAME = re.compile(
    _LAYER + r"(?P<block>mlp|block_sparse_moe)\.experts\.(?P<expert>0|[1-9][0-9]{0,5})\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.lora_(?P<kind>[AB])" + _ADAPTER + r"\.weight"
)
_SHARED_NAME = re.compile(
    _LAYER + r"mlp\.(?P<module>shared_expert\.(?:gate_proj|up_proj|down_proj)|shared_expert_gate)"
    r"\.lora_(?P<kind>[AB])" + _ADAPTER + r"\.weight"
)
_ROUTER_NAME = re.compile(
    _LAYER + r"(?:mlp|block_sparse_moe)\.gate\.lora_(?P<kind>[AB])" + _ADAPTER + r"\.weight"
)

# The parameters `target_parameters` may name, as PEFT matches them (a key or its suffix).
_PARAM_KEYS = {
    "experts.gate_up_proj": "mlp.experts.gate_up_proj",
    "experts.down_proj": "mlp.experts.down_proj",
    ROUTER_MODULE: "mlp.gate.weight",
}


@dataclass(frozen=True)
class ExpertTensorName:
    """A parsed expert/router LoRA tensor name: layer, target, expert (per-expert), A or B."""

    layer_idx: int
    module: str  # one of EXPERT_MODULES
    kind: str  # "A" or "B"
    expert: int | None = None  # per-expert layout only
    nest: int = 0  # fused layout: "base_layer." segments before lora_X


@dataclass(frozen=True)
class MoeShape:
    """The expert shapes of a MoE base config, and which layers are sparse."""

    hidden: int
    intermediate: int
    num_experts: int
    sparse_layers: frozenset[int]
    block: str  # "block_sparse_moe" (Mixtral's legacy name) or "mlp"
    shared_intermediate: int = 0  # Qwen2-MoE's shared expert (0: none)


def moe_shape(hf_config: dict[str, Any]) -> MoeShape | None:
    """The MoE shape of a base config, or None for a dense model (torch-free)."""
    experts = 0
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        value = hf_config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            experts = value
            break
    if not experts:
        return None
    kind = str(hf_config.get("model_type") or "")
    layers = int(hf_config["num_hidden_layers"])
    hidden = int(hf_config["hidden_size"])
    sparse: Sequence[int]
    if kind == "mixtral":
        inter, sparse = int(hf_config["intermediate_size"]), range(layers)
    else:
        inter = int(hf_config.get("moe_intermediate_size") or hf_config["intermediate_size"])
        dense = set(hf_config.get("mlp_only_layers") or [])
        step = int(hf_config.get("decoder_sparse_step", 1) or 1)
        first_dense = int(hf_config.get("first_k_dense_replace", 0) or 0)
        sparse = [
            i for i in range(layers) if i not in dense and (i + 1) % step == 0 and i >= first_dense
        ]
    block = "block_sparse_moe" if kind == "mixtral" else "mlp"
    shared = (
        int(hf_config.get("shared_expert_intermediate_size") or 0) if kind == "qwen2_moe" else 0
    )
    return MoeShape(hidden, inter, experts, frozenset(sparse), block, shared)


def expert_dims(shape: MoeShape, module: str) -> tuple[int, int]:
    """(in_features, out_features) of one expert's (or the router's) targeted weight."""
    h, i = shape.hidden, shape.intermediate
    return {
        "experts.gate_up_proj": (h, 2 * i),
        "experts.down_proj": (i, h),
        "per_expert.gate_proj": (h, i),
        "per_expert.up_proj": (h, i),
        "per_expert.down_proj": (i, h),
        ROUTER_MODULE: (h, shape.num_experts),
        "shared_expert.gate_proj": (h, shape.shared_intermediate),
        "shared_expert.up_proj": (h, shape.shared_intermediate),
        "shared_expert.down_proj": (shape.shared_intermediate, h),
        "shared_expert_gate": (h, 1),
    }[module]


def expected_shape(shape: MoeShape, module: str, kind: str, rank: int) -> tuple[int, int]:
    """The lora_A / lora_B shape PEFT writes for `module` at `rank`."""
    d_in, d_out = expert_dims(shape, module)
    r = rank * shape.num_experts if module in FUSED_MODULES else rank
    return (r, d_in) if kind == "A" else (d_out, r)


def parse_expert_tensor_name(
    name: str, fused_of: Callable[[int], tuple[str, ...]]
) -> ExpertTensorName | None:
    """Parse an expert or router LoRA tensor name; None when it is not one.

    `fused_of(layer)` lists the fused targets the adapter has in that layer, in the module's
    parameter order (gate_up_proj before down_proj): PEFT nests their wrappers, the first one
    innermost. Raises ValueError for a fused name whose nesting matches no targeted parameter.
    """
    if not isinstance(name, str) or len(name) > 256:
        return None
    if m := _FUSED_NAME.fullmatch(name):
        targeted_fused = fused_of(int(m["layer"]))
        nest = m["nest"].count("base_layer")
        depth = len(targeted_fused) - 1 - nest
        if not 0 <= depth < len(targeted_fused):
            raise ValueError(
                f"tensor {name!r} is a fused expert LoRA tensor but adapter_config.json's "
                f"target_parameters name {len(targeted_fused)} expert tensor(s) of that layer"
            )
        return ExpertTensorName(int(m["layer"]), targeted_fused[depth], m["kind"], nest=nest)
    if m := _PER_EXPERT_NAME.fullmatch(name):
        proj = _LEGACY.get(m["proj"], m["proj"])
        return ExpertTensorName(
            int(m["layer"]), f"per_expert.{proj}", m["kind"], expert=int(m["expert"])
        )
    if m := _ROUTER_NAME.fullmatch(name):
        return ExpertTensorName(int(m["layer"]), ROUTER_MODULE, m["kind"])
    if m := _SHARED_NAME.fullmatch(name):
        return ExpertTensorName(int(m["layer"]), m["module"], m["kind"])
    return None


def fused_order(modules: set[str] | list[str]) -> tuple[str, ...]:
    """The fused targets among `modules` in the experts module's parameter order."""
    return tuple(m for m in FUSED_MODULES if m in modules)


def param_key(layer: int, module: str) -> str:
    """PEFT's key of a targeted parameter (`model.layers.3.mlp.experts.gate_up_proj`)."""
    return f"model.layers.{layer}.{_PARAM_KEYS[module]}"


def param_targets(entries: list[str], layer: int) -> set[str]:
    """Which of the fused/router targets `target_parameters` entries name in `layer`
    (PEFT: the key itself or a suffix after a dot)."""
    found = set()
    for module in _PARAM_KEYS:
        key = param_key(layer, module)
        if any(key == e or key.endswith("." + e) for e in entries):
            found.add(module)
    return found


def unserved_parameter(entries: list[str]) -> str | None:
    """The first `target_parameters` entry naming no servable expert/router parameter."""
    keys = [param_key(0, m) for m in _PARAM_KEYS]
    for entry in entries:
        if not any(k == entry or k.endswith("." + entry) for k in keys):
            return entry
    return None


def per_expert_keys(shape: MoeShape, layer: int, expert: int, proj: str) -> list[str]:
    """The PEFT module keys one expert projection may have (Qwen-style and Mixtral's legacy)."""
    legacy = {v: k for k, v in _LEGACY.items()}[proj]
    return [
        f"model.layers.{layer}.mlp.experts.{expert}.{proj}",
        f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{legacy}",
    ]


def shared_keys(shape: MoeShape, layer: int) -> dict[str, str]:
    """The shared expert's targets and their PEFT module keys in `layer` (none without one)."""
    if not shape.shared_intermediate:
        return {}
    return {m: f"model.layers.{layer}.mlp.{m}" for m in SHARED_MODULES}


def router_keys(layer: int) -> list[str]:
    """The PEFT module keys of a layer's router (`gate`)."""
    return [f"model.layers.{layer}.mlp.gate", f"model.layers.{layer}.block_sparse_moe.gate"]

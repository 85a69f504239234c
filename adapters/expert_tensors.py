"""Expert and router LoRA tensor names of an adapter, checked against the base (torch-free).

Validation (header only) and the loader (`expert_weights`, tensors) both classify a tensor
name here: which layer and target, the A/B pair it belongs to and the shape it must have.
"""

from __future__ import annotations

from dataclasses import dataclass

from .expert_targets import (
    FUSED_MODULES,
    ExpertTensorName,
    MoeShape,
    expected_shape,
    parse_expert_tensor_name,
)
from .peft_format import AdapterFormatError
from .targets import ResolvedTargets


@dataclass(frozen=True)
class ExpertTensor:
    """A classified expert/router tensor: the parsed name, its pair path and expected shape."""

    parsed: ExpertTensorName
    path: str
    shape: tuple[int, int]


def target_paths(layer: int, module: str, shape: MoeShape) -> list[str]:
    """The A/B pair paths one expert target needs (one per expert in the per-expert layout)."""
    if module.startswith("per_expert."):
        proj = module.split(".", 1)[1]
        return [f"model.layers.{layer}.experts.{e}.{proj}" for e in range(shape.num_experts)]
    return [f"model.layers.{layer}.{module}"]


def classify(name: str, targets: ResolvedTargets, shape: MoeShape | None) -> ExpertTensor | None:
    """The expert/router tensor `name` names, checked against the targets and the base (None
    when `name` is not an expert/router tensor name). Raises AdapterFormatError."""

    def fused_of(layer: int) -> tuple[str, ...]:
        return tuple(m for m in FUSED_MODULES if targets.get(layer, m) is not None)

    try:
        parsed = parse_expert_tensor_name(name, fused_of)
    except ValueError as exc:
        raise AdapterFormatError(str(exc)) from None
    if parsed is None:
        return None
    if shape is None or parsed.layer_idx not in shape.sparse_layers:
        raise AdapterFormatError(
            f"tensor {name!r} targets experts or a router in layer {parsed.layer_idx}, which is "
            "not a mixture-of-experts layer of the base model"
        )
    if parsed.expert is not None and parsed.expert >= shape.num_experts:
        raise AdapterFormatError(
            f"tensor {name!r} targets expert {parsed.expert}; the base has {shape.num_experts}"
        )
    target = targets.get(parsed.layer_idx, parsed.module)
    if target is None:
        raise AdapterFormatError(
            f"tensor {name!r} targets layer {parsed.layer_idx} {parsed.module}, which "
            "adapter_config.json's target_modules / target_parameters do not include"
        )
    path = f"model.layers.{parsed.layer_idx}.{parsed.module}"
    if parsed.expert is not None:
        path = f"model.layers.{parsed.layer_idx}.experts.{parsed.expert}.{parsed.module[11:]}"
    want = expected_shape(shape, parsed.module, parsed.kind, target.rank)
    return ExpertTensor(parsed, path, want)

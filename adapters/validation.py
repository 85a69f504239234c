"""Pure validation of an uploaded PEFT LoRA adapter against its base model.

No database, no object storage: the caller hands in the config bytes, the safetensors header
bytes and the base model's parsed config.json; this module decides `ready` or `failed` and
why. The validation job and the API's synchronous checks both use it, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraplex.adapters.expert_targets import EXPERT_MODULES, moe_shape
from loraplex.adapters.expert_tensors import ExpertTensor, classify, target_paths
from loraplex.adapters.peft_format import (
    AdapterFormatError,
    PeftAdapterConfig,
    module_dims,
    module_path,
    parse_adapter_config,
    parse_lora_tensor_name,
)
from loraplex.adapters.targets import ResolvedTargets, keep_present, resolve_targets
from loraplex.loader.safetensors_header import (
    SafetensorsError,
    SafetensorsHeader,
    TensorInfo,
    parse_header,
    read_header_length,
)

ALLOWED_DTYPES = ("F32", "F16", "BF16")
SNIFF_BYTES = 8


class AdapterValidationError(ValueError):
    """The adapter is refused; `reason` is fit to show the uploader, `code` is for machines."""

    def __init__(self, reason: str, code: str):
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True)
class ValidationResult:
    """What a valid adapter records on its version."""

    rank: int
    alpha: float
    use_rslora: bool
    target_modules: list[str]
    tensor_count: int
    dtypes: list[str]
    targets: ResolvedTargets


def sniff_pickle(first_bytes: bytes) -> str | None:
    """A reason to refuse when the file looks like pickled weights (torch.save), else None."""
    head = bytes(first_bytes[:SNIFF_BYTES])
    if head.startswith(b"PK\x03\x04"):
        return "zip archive (torch.save format)"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return f"pickle protocol {head[1]}"
    return None


def _refuse_pickle(first_bytes: bytes) -> None:
    kind = sniff_pickle(first_bytes)
    if kind is not None:
        raise AdapterValidationError(
            f"adapter_model looks like pickled weights ({kind}); pickle files are refused "
            "because loading them can run code: upload adapter_model.safetensors instead",
            "pickle_refused",
        )


def parse_config(raw: bytes | None, max_bytes: int) -> PeftAdapterConfig:
    """Parse adapter_config.json bytes, refusing missing, oversized, non-JSON or unsupported."""
    if raw is None or len(raw) == 0:
        raise AdapterValidationError("adapter_config.json is missing or empty", "invalid_config")
    if len(raw) > max_bytes:
        raise AdapterValidationError(
            f"adapter_config.json is {len(raw)} bytes; at most {max_bytes} are allowed",
            "config_too_large",
        )
    try:
        return parse_adapter_config(raw)
    except AdapterFormatError as exc:
        raise AdapterValidationError(str(exc), "invalid_config") from None


def header_length(first8: bytes, file_size: int, max_header_bytes: int) -> int:
    """The safetensors header length N from the first 8 bytes (refusing pickles and bad N)."""
    _refuse_pickle(first8)
    try:
        return read_header_length(first8, file_size, max_header_bytes)
    except SafetensorsError as exc:
        raise AdapterValidationError(
            f"adapter_model.safetensors: {exc}", "invalid_safetensors"
        ) from None


def parse_weights_header(header_bytes: bytes, file_size: int) -> SafetensorsHeader:
    """Parse the N header bytes with the reference reader's rules."""
    try:
        return parse_header(header_bytes, file_size)
    except SafetensorsError as exc:
        raise AdapterValidationError(
            f"adapter_model.safetensors: {exc}", "invalid_safetensors"
        ) from None


def _base_dims(base_config: dict[str, Any]) -> tuple[dict[str, tuple[int, int]], int]:
    try:
        dims = module_dims(base_config)
        layers = int(base_config["num_hidden_layers"])
    except (AdapterFormatError, KeyError, TypeError, ValueError) as exc:
        raise AdapterValidationError(
            f"the base model's config.json cannot be used for validation: {exc}", "base_model"
        ) from None
    return dims, layers


def check_tensors(
    config: PeftAdapterConfig, header: SafetensorsHeader, base_config: dict[str, Any], max_rank: int
) -> ValidationResult:
    """Every tensor maps to a base-model module the config targets, with the right dtype and
    shape; A/B come in pairs; every rank is within `max_rank`."""
    if not header.tensors:
        raise AdapterValidationError("adapter_model.safetensors holds no tensors", "empty_adapter")
    dims, num_layers = _base_dims(base_config)
    try:
        targets = resolve_targets(config, base_config)
    except AdapterFormatError as exc:
        raise AdapterValidationError(str(exc), "invalid_config") from None
    kinds: dict[str, set[str]] = {}
    ranks: dict[str, int] = {}
    shape = moe_shape(base_config)
    present: set[tuple[int, str]] = set()
    for name, info in header.tensors.items():
        try:
            expert = classify(name, targets, shape)
        except AdapterFormatError as exc:
            raise AdapterValidationError(str(exc), "unknown_module") from None
        if expert is not None:
            _check_expert(name, info, expert, kinds)
            target = targets.get(expert.parsed.layer_idx, expert.parsed.module)
            ranks[expert.path] = target.rank  # type: ignore[union-attr]  # classify() found its target
            present.add((expert.parsed.layer_idx, expert.parsed.module))
            continue
        try:
            parsed = parse_lora_tensor_name(name)
        except AdapterFormatError as exc:
            raise AdapterValidationError(str(exc), "unknown_module") from None
        path = parsed.module_path
        if parsed.module not in dims or parsed.layer_idx >= num_layers:
            raise AdapterValidationError(
                f"tensor {name!r} targets {path}, which the base model does not have "
                f"({num_layers} layers; LoRA-targetable modules: {', '.join(sorted(dims))})",
                "unknown_module",
            )
        target = targets.get(parsed.layer_idx, parsed.module)
        if target is None:
            raise AdapterValidationError(
                f"tensor {name!r} targets {path}, which adapter_config.json's target_modules "
                f"({config.target_modules!r}) does not include",
                "unknown_module",
            )
        if info.dtype not in ALLOWED_DTYPES:
            raise AdapterValidationError(
                f"tensor {name!r} has dtype {info.dtype}; LoRA weights must be one of "
                f"{', '.join(ALLOWED_DTYPES)}",
                "unsupported_dtype",
            )
        r = target.rank
        in_f, out_f = dims[parsed.module]
        expected = (r, in_f) if parsed.kind == "A" else (out_f, r)
        if tuple(info.shape) != expected:
            raise AdapterValidationError(
                f"tensor {name!r} has shape {list(info.shape)}; {parsed.module} of the base "
                f"model with rank {r} needs lora_{parsed.kind} of shape {list(expected)}",
                "shape_mismatch",
            )
        if parsed.kind in kinds.setdefault(path, set()):
            raise AdapterValidationError(f"{path} has two lora_{parsed.kind} tensors", "duplicate")
        kinds[path].add(parsed.kind)
        ranks[path] = r
    for path, found in sorted(kinds.items()):
        if found != {"A", "B"}:
            missing = ({"A", "B"} - found).pop()
            raise AdapterValidationError(
                f"{path} has lora_{found.pop()} but no lora_{missing}", "missing_pair"
            )
    targets = keep_present(targets, present, config.target_parameters)
    for layer, module in sorted(targets.modules):
        paths = (
            target_paths(layer, module, shape)  # type: ignore[arg-type]  # expert modules imply an MoE shape
            if module in EXPERT_MODULES
            else [module_path(layer, module)]
        )
        for path in paths:
            if path not in kinds:
                raise AdapterValidationError(
                    f"adapter_config.json targets {path} but the weights have no "
                    "lora_A/lora_B for it",
                    "missing_pair",
                )
    top = max(ranks.values())
    if top > max_rank:
        worst = max(ranks, key=ranks.__getitem__)
        raise AdapterValidationError(
            f"rank {top} (at {worst}) is over this base model's limit of {max_rank} "
            "(the deployment's max_lora_rank)",
            "rank_too_large",
        )
    return ValidationResult(
        rank=top,
        alpha=float(config.lora_alpha),
        use_rslora=bool(config.use_rslora),
        target_modules=sorted({p.rsplit(".", 1)[-1] for p in kinds}),
        tensor_count=len(header.tensors),
        dtypes=sorted({t.dtype for t in header.tensors.values()}),
        targets=targets,
    )


def _check_expert(
    name: str, info: TensorInfo, expert: ExpertTensor, kinds: dict[str, set[str]]
) -> None:
    """dtype, shape and A/B uniqueness of one expert/router tensor."""
    if info.dtype not in ALLOWED_DTYPES:
        raise AdapterValidationError(
            f"tensor {name!r} has dtype {info.dtype}; LoRA weights must be one of "
            f"{', '.join(ALLOWED_DTYPES)}",
            "unsupported_dtype",
        )
    kind = expert.parsed.kind
    if tuple(info.shape) != expert.shape:
        raise AdapterValidationError(
            f"tensor {name!r} has shape {list(info.shape)}; {expert.parsed.module} of the base "
            f"model needs lora_{kind} of shape {list(expert.shape)}",
            "shape_mismatch",
        )
    if kind in kinds.setdefault(expert.path, set()):
        raise AdapterValidationError(f"{expert.path} has two lora_{kind} tensors", "duplicate")
    kinds[expert.path].add(kind)


def validate_adapter(
    config_bytes: bytes | None,
    header_prefix: bytes,
    file_size: int,
    base_config: dict[str, Any],
    *,
    max_rank: int,
    max_config_bytes: int = 64 * 1024,
    max_header_bytes: int = 16 * 1024 * 1024,
) -> ValidationResult:
    """Validate an adapter from its config bytes and the first 8+N bytes of its weights file."""
    config = parse_config(config_bytes, max_config_bytes)
    n = header_length(header_prefix[:8], file_size, max_header_bytes)
    if len(header_prefix) < 8 + n:
        raise AdapterValidationError(
            f"adapter_model.safetensors: header needs {8 + n} bytes, only {len(header_prefix)} "
            "were read",
            "invalid_safetensors",
        )
    header = parse_weights_header(header_prefix[8 : 8 + n], file_size)
    return check_tensors(config, header, base_config, max_rank)

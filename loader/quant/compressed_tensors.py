"""Read compressed-tensors checkpoints (`quantization_config.quant_method: compressed-tensors`)
into the canonical quantized layout, without re-quantizing.

Served schemes (one config group targeting Linear, `lm_head` ignored):
- int4 `pack-quantized`, group 128, symmetric or asymmetric: `weight_packed` int32 [out, in/8]
  (eight 4-bit codes per word, low bits first, each `q + 8`), `weight_scale` [out, in/128],
  asymmetric `weight_zero_point` int32 packed the same way along the output dim; w = (q - zp) s;
- int8 `int-quantized` (or `naive-quantized`), per channel, symmetric: `weight` int8 + scale;
- int8 in groups of 128 (w8a16 group 128), symmetric: `int-quantized` (`weight` int8) or
  `pack-quantized` (`weight_packed` int32 [out, in/4], four codes a word, low bits first, each
  `q + 128`), `weight_scale` [out, in/128];
- fp8 e4m3 `float-quantized`, per channel: `weight` fp8 + scale, activations dynamic per token,
  or static: one calibrated `input_scale` per Linear (`input_activations` float 8-bit
  per-tensor, `dynamic: false`), handed on as `input_scale` repeated over the Linear's output
  rows so a fused layer keeps each projection's own scale.
Anything else is refused with NotImplementedError saying what is served.
"""

from __future__ import annotations

from typing import Any

import torch

from loraplex.loader.quant.module_parts import ModuleParts
from loraplex.loader.quant.schemes import INT4_GROUP_SIZE, QuantScheme

_PIECES = (
    "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight", "input_scale",
)  # fmt: skip
_SERVED = (
    "int4 pack-quantized group 128 (sym/asym), int8 per-channel or group-128 symmetric, "
    "fp8 e4m3 per-channel (activations dynamic, or static per-tensor input scales)"
)
INT8_GROUP_SIZE = 128


def checkpoint_quant_method(hf_config: dict[str, Any]) -> str | None:
    """`quantization_config.quant_method` of a pre-quantized checkpoint (None if plain)."""
    qc = hf_config.get("quantization_config")
    return str(qc.get("quant_method")) if isinstance(qc, dict) else None


def compressed_tensors_scheme(hf_config: dict[str, Any]) -> QuantScheme | None:
    """The scheme a compressed-tensors checkpoint fixes (None if the checkpoint is not one);
    NotImplementedError for schemes the engine does not serve."""
    if checkpoint_quant_method(hf_config) != "compressed-tensors":
        return None
    qc = hf_config["quantization_config"]
    groups = list((qc.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise NotImplementedError(
            f"compressed-tensors checkpoint with {len(groups)} config groups is not served; "
            f"served: {_SERVED}"
        )
    group = groups[0]
    static = _static_input(group.get("input_activations"))
    w = group.get("weights") or {}
    fmt = group.get("format") or qc.get("format")
    kind, bits, strategy = w.get("type"), w.get("num_bits"), w.get("strategy")
    ignore = [i for i in qc.get("ignore") or [] if i not in ("lm_head", "re:.*lm_head")]
    if ignore:
        raise NotImplementedError(f"compressed-tensors `ignore` {ignore} is not served")
    if static and (kind, bits, strategy, fmt) != ("float", 8, "channel", "float-quantized"):
        raise NotImplementedError(
            f"static activation scales are served with fp8 per-channel weights only, not with "
            f"weights {w} in format {fmt!r}; served: {_SERVED}"
        )
    if (kind, bits, strategy, fmt) == ("int", 4, "group", "pack-quantized") and w.get(
        "group_size"
    ) == INT4_GROUP_SIZE:
        sym = bool(w.get("symmetric"))
        return QuantScheme("int4_sym" if sym else "int4", "int4", None, INT4_GROUP_SIZE, sym)
    if (
        (kind, bits, strategy) == ("int", 8, "channel")
        and w.get("symmetric")
        and fmt
        in (
            "int-quantized",
            "naive-quantized",
        )
    ):
        return QuantScheme("int8", "int8", None)
    if (
        (kind, bits, strategy) == ("int", 8, "group")
        and w.get("group_size") == INT8_GROUP_SIZE
        and w.get("symmetric")
        and fmt in ("int-quantized", "naive-quantized", "pack-quantized")
    ):
        return QuantScheme("int8", "int8", None, group_size=INT8_GROUP_SIZE)
    if (kind, bits, strategy, fmt) == ("float", 8, "channel", "float-quantized"):
        return QuantScheme("fp8", "fp8", None, static_input=static)
    raise NotImplementedError(
        f"compressed-tensors weights {w} in format {fmt!r} are not served; served: {_SERVED}"
    )


def _static_input(acts: Any) -> bool:
    """Whether the group's activations are quantized with static scales (refusing the static
    kinds not served: only fp8 per-tensor)."""
    if acts in (None, {}) or acts.get("dynamic") is True:
        return False
    kind = (acts.get("type"), acts.get("num_bits"), acts.get("strategy"))
    if kind != ("float", 8, "tensor") or not acts.get("symmetric", True):
        raise NotImplementedError(
            f"compressed-tensors static input activations {acts} are not served; served: fp8 "
            "per-tensor symmetric input scales"
        )
    return True


def unpack_int4(packed: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Codes (uint8, 0..15) of int32 words holding eight 4-bit values each along `dim`."""
    p = packed.movedim(dim, -1).to(torch.int32)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=p.device)
    codes = ((p[..., None] >> shifts) & 0xF).flatten(-2)[..., :length]
    return codes.to(torch.uint8).movedim(-1, dim).contiguous()


def unpack_int8(packed: torch.Tensor, length: int) -> torch.Tensor:
    """int8 codes of int32 words holding four `q + 128` bytes each (low byte first) along
    the last dim."""
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=packed.device)
    biased = ((packed.to(torch.int32)[..., None] >> shifts) & 0xFF).flatten(-2)[..., :length]
    return (biased - 128).to(torch.int8).contiguous()


class CompressedTensorsReader:
    """Collects each Linear's compressed tensors as they stream in (any order) and hands on
    the canonical `weight` / `weight_scale` / `weight_zero` once a module is complete."""

    def __init__(self, scheme: QuantScheme, in_features: dict[str, int]) -> None:
        self.scheme = scheme
        self.in_features = in_features  # "<prefix>." -> in_features of its Linear
        self._parts = ModuleParts("compressed-tensors")

    def _needs(self) -> set[str]:
        if self.scheme.kind == "int4":
            return {"weight_packed", "weight_scale"} | (
                set() if self.scheme.symmetric else {"weight_zero_point"}
            )
        return {"weight", "weight_scale"} | ({"input_scale"} if self.scheme.static_input else set())

    def apply(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The canonical tensors ready after `name` arrived (none while a module is partial)."""
        prefix, _, piece = name.rpartition(".")
        prefix += "."
        if piece not in _PIECES or prefix not in self.in_features:
            return [(name, tensor)]
        if piece == "weight_shape":
            return []
        if piece == "input_scale" and not self.scheme.static_input:
            raise ValueError(f"{name}: an input scale in a checkpoint without static activations")
        if piece == "weight_packed" and self.scheme.kind == "int8":
            piece = "weight"  # int8 pack-quantized: int32 words, unpacked once complete
        parts = self._parts.add(prefix, piece, tensor, self._needs())
        return [] if parts is None else self._canonical(prefix, parts)

    def _canonical(
        self, prefix: str, parts: dict[str, torch.Tensor]
    ) -> list[tuple[str, torch.Tensor]]:
        scale = parts["weight_scale"].float()
        if self.scheme.kind == "int8" and self.scheme.group_size:
            weight = parts["weight"]
            if weight.dtype == torch.int32:
                weight = unpack_int8(weight, self.in_features[prefix])
            return [(prefix + "weight", weight), (prefix + "weight_scale", scale)]
        if self.scheme.kind != "int4":
            out = [(prefix + "weight", parts["weight"]), (prefix + "weight_scale", scale[:, 0])]
            if self.scheme.static_input:
                value = parts["input_scale"].float().reshape(-1)
                if value.numel() != 1 or not bool(value[0] > 0):
                    raise ValueError(f"{prefix}input_scale must be one positive value")
                rows = parts["weight"].shape[0]
                out.append((prefix + "input_scale", value.expand(rows).clone()))
            return out
        codes = unpack_int4(parts["weight_packed"], self.in_features[prefix], dim=1)
        out = [(prefix + "weight", codes), (prefix + "weight_scale", scale)]
        if not self.scheme.symmetric:
            # stored as zp + 8, which is the canonical zero point of the codes (q + 8)
            zero = unpack_int4(parts["weight_zero_point"], scale.shape[0], dim=0).float()
            out.append((prefix + "weight_zero", zero))
        return out

    def finish(self) -> None:
        """Raise if a module's tensors never all arrived."""
        self._parts.finish()

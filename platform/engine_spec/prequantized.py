"""Which AWQ and GPTQ checkpoints the engine reads, from their `quantization_config`.

Torch-free, so the control plane refuses an unread checkpoint before it stores a deployment and
the engine builds its reader from the same answer. Served: AWQ `version: gemm` (AutoAWQ's
layout), 4 bits, groups of 128, with zero points; GPTQ in the `gptq` checkpoint format
(AutoGPTQ's, zero points stored minus one), 4 bits, groups of 128, symmetric or not, with or
without act-order (`desc_act`, a `g_idx` permutation). GPTQ's `use_exllama` / `exllama_config`
pick a runtime kernel, not a layout, and are ignored. Everything else is NotImplementedError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraplex.loader.quant_choices import PREQUANTIZED

PREQUANTIZED_WEIGHTS = PREQUANTIZED
SERVED_GROUP_SIZE = 128
SERVED_AWQ_GPTQ = (
    "AWQ version gemm, 4 bits, group_size 128, zero_point true; GPTQ checkpoint_format gptq, "
    "4 bits, group_size 128, sym true or false, desc_act true (with g_idx) or false"
)


@dataclass(frozen=True)
class AwqGptqFormat:
    """An AWQ / GPTQ checkpoint the engine reads: its method and what its layout needs."""

    method: str  # "awq" | "gptq"
    group_size: int
    symmetric: bool
    act_order: bool  # GPTQ desc_act: g_idx may permute the inputs among groups


def _refuse(method: str, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{method.upper()} checkpoint with {what} is not served; served: {SERVED_AWQ_GPTQ}"
    )


def _common(method: str, qc: dict[str, Any], bits_key: str, group_key: str) -> int:
    bits = qc.get("bits", qc.get(bits_key))
    group = qc.get("group_size", qc.get(group_key))
    if bits != 4:
        raise _refuse(method, f"bits {bits}")
    if group != SERVED_GROUP_SIZE:
        raise _refuse(method, f"group_size {group}")
    return SERVED_GROUP_SIZE


def awq_gptq_format(hf_config: dict[str, Any]) -> AwqGptqFormat | None:
    """The AWQ / GPTQ layout of `hf_config`'s checkpoint (None if it is neither);
    NotImplementedError naming what is served when the engine does not read this one."""
    qc = hf_config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method") or "").lower()
    if method == "awq":
        group = _common(method, qc, "w_bit", "q_group_size")
        version = str(qc.get("version") or "gemm").lower()
        if version != "gemm":
            raise _refuse(method, f"version {version!r} (packing of its own)")
        if str(qc.get("backend") or "autoawq").lower() != "autoawq":
            raise _refuse(method, f"backend {qc.get('backend')!r} (llm-awq packing)")
        if qc.get("zero_point", True) is not True:
            raise _refuse(method, "zero_point false")
        kept = [m for m in qc.get("modules_to_not_convert") or [] if m != "lm_head"]
        if kept:  # the engine serves every decoder Linear quantized (lm_head never is)
            raise _refuse(method, f"modules_to_not_convert {kept}")
        return AwqGptqFormat("awq", group, symmetric=False, act_order=False)
    if method == "gptq":
        group = _common(method, qc, "bits", "group_size")
        fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
        if fmt != "gptq":
            raise _refuse(method, f"checkpoint_format {fmt!r}")
        if str(qc.get("pack_dtype") or "int32").replace("torch.", "") != "int32":
            raise _refuse(method, f"pack_dtype {qc['pack_dtype']!r}")
        if qc.get("lm_head"):
            raise _refuse(method, "a quantized lm_head")
        if qc.get("dynamic") or qc.get("modules_in_block_to_quantize"):
            raise _refuse(method, "per-module overrides (dynamic / modules_in_block_to_quantize)")
        return AwqGptqFormat(
            "gptq", group, symmetric=bool(qc.get("sym", True)), act_order=bool(qc.get("desc_act"))
        )
    return None

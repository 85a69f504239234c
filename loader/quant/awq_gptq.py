"""Read AWQ (gemm) and GPTQ 4-bit checkpoints into the canonical int4 layout, no re-quantizing.

AWQ gemm (AutoAWQ's layout): `qweight` int32 [in, out/8] holds eight 4-bit codes per word along
the outputs, output `8c + [0, 2, 4, 6, 1, 3, 5, 7][k]` in bits 4k..4k+3 of word c; `qzeros` int32
[in/128, out/8] packs the integer zero points the same way; `scales` [in/128, out];
w = (q - z) * s.
GPTQ (AutoGPTQ's `gptq` checkpoint format): `qweight` int32 [in/8, out] holds eight codes per word
along the inputs, low bits first; `qzeros` int32 [groups, out/8] packs z - 1 along the outputs
(the format's historical offset); `scales` [groups, out]; `g_idx` int32 [in] is the group of
each input: w[:, i] = (q[:, i] - z[:, g_idx[i]]) * s[:, g_idx[i]].
Act-order (`desc_act`): g_idx spreads each group over the inputs. The reader permutes the input
dimension so groups become contiguous (codes column j is input `input_perm[j]`) and emits
`input_perm`; the engine gathers the activations by it before the packed int4 matmul.
The canonical tensors are `<p>.weight` (uint8 codes [out, in]), `<p>.weight_scale` and
`<p>.weight_zero` (float32 [out, groups]) and, for act-order schemes, `<p>.input_perm` (int64 [in]).
"""

from __future__ import annotations

import torch

from loraplex.loader.quant.compressed_tensors import unpack_int4
from loraplex.loader.quant.module_parts import ModuleParts
from loraplex.loader.quant.schemes import QuantScheme
from loraplex.loader.quant_choices import PREQUANTIZED

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ's gemm packing: nibble k of a word holds output column AWQ_ORDER[k] of its eight."""
_AWQ_UNDO = torch.tensor([AWQ_ORDER.index(j) for j in range(8)])
_PIECES = ("qweight", "qzeros", "scales", "g_idx")


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """AWQ gemm words [rows, cols/8] -> codes [rows, cols] (uint8, natural column order)."""
    rows, words = packed.shape
    nibbles = unpack_int4(packed, words * 8, dim=1).view(rows, words, 8)
    return nibbles[..., _AWQ_UNDO].reshape(rows, words * 8).contiguous()


def act_order_permutation(g_idx: torch.Tensor, group_size: int) -> torch.Tensor:
    """The input order (int64 [in]) that makes every group contiguous; NotImplementedError when
    the groups do not hold `group_size` inputs each (then no contiguous grouping exists)."""
    g = g_idx.to(torch.int64)
    groups = g.numel() // group_size
    counts = torch.bincount(g, minlength=groups)
    if counts.numel() != groups or bool((counts != group_size).any()):
        raise NotImplementedError(
            f"GPTQ g_idx with groups of unequal size (not {group_size} inputs each) is not served"
        )
    return torch.argsort(g, stable=True)


class AwqGptqReader:
    """Collects each Linear's AWQ / GPTQ tensors as they stream in (any order) and hands on
    the canonical int4 tensors once a module is complete."""

    def __init__(self, scheme: QuantScheme, in_features: dict[str, int]) -> None:
        if scheme.name not in PREQUANTIZED or scheme.kind != "int4":
            raise ValueError(f"AwqGptqReader reads awq / gptq int4 schemes, not {scheme.name!r}")
        self.scheme = scheme
        self.in_features = in_features  # "<prefix>." -> in_features of its Linear
        self._parts = ModuleParts(scheme.name)
        self._done: set[str] = set()

    def _needs(self) -> set[str]:
        base = {"qweight", "qzeros", "scales"}
        return base | {"g_idx"} if self.scheme.act_order else base

    def apply(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The canonical tensors ready after `name` arrived (none while a module is partial)."""
        prefix, _, piece = name.rpartition(".")
        prefix += "."
        if piece not in _PIECES:
            return [(name, tensor)]
        if prefix not in self.in_features:
            if piece == "scales":  # not a packed-int4 name on its own
                return [(name, tensor)]
            raise NotImplementedError(
                f"{name}: {self.scheme.name} weights of a module the engine does not serve "
                "quantized (served: the decoder layers' attention and dense MLP Linears; not "
                "MoE experts, lm_head or embeddings)"
            )
        if prefix in self._done:  # a late trivial g_idx of a module already handed on
            self._check_trivial(prefix, tensor)
            return []
        parts = self._parts.add(prefix, piece, tensor, self._needs())
        if parts is None:
            return []
        self._done.add(prefix)
        return self._canonical(prefix, parts)

    def _check_trivial(self, prefix: str, g_idx: torch.Tensor) -> None:
        inp, group = self.in_features[prefix], self.scheme.group_size
        want = torch.arange(inp, device=g_idx.device) // group
        if g_idx.shape != want.shape or not torch.equal(g_idx.to(torch.int64), want):
            raise ValueError(
                f"{prefix}g_idx permutes the groups but the checkpoint says desc_act false"
            )

    def _canonical(
        self, prefix: str, parts: dict[str, torch.Tensor]
    ) -> list[tuple[str, torch.Tensor]]:
        inp, group = self.in_features[prefix], self.scheme.group_size
        groups = inp // group
        if self.scheme.name == "awq":
            codes = unpack_awq(parts["qweight"]).t()
            zero = unpack_awq(parts["qzeros"]).float()
        else:
            codes = unpack_int4(parts["qweight"], inp, dim=0).t()
            out = parts["qweight"].shape[1]
            zero = unpack_int4(parts["qzeros"], out, dim=1).float() + 1.0
        out = codes.shape[0]
        scale = parts["scales"].float()
        if codes.shape[1] != inp or scale.shape != (groups, out) or zero.shape != (groups, out):
            raise ValueError(
                f"{prefix}: {self.scheme.name} tensors qweight {tuple(parts['qweight'].shape)}, "
                f"qzeros {tuple(parts['qzeros'].shape)}, scales {tuple(scale.shape)} do not fit "
                f"a Linear of {inp} inputs in groups of {group}"
            )
        result = [
            (prefix + "weight_scale", scale.t().contiguous()),
            (prefix + "weight_zero", zero.t().contiguous()),
        ]
        if self.scheme.act_order:
            perm = act_order_permutation(parts["g_idx"], group)
            codes = codes[:, perm]
            result.append((prefix + "input_perm", perm))
        elif "g_idx" in parts:
            self._check_trivial(prefix, parts["g_idx"])
        return [(prefix + "weight", codes.contiguous()), *result]

    def finish(self) -> None:
        """Raise if a module's tensors never all arrived."""
        self._parts.finish()

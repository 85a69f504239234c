"""Expert and router LoRA of an adapter in one layout, whichever PEFT layout it came in.

The loader turns either layout (`expert_targets`) into one `ExpertLoraModule` per MoE layer:
per-expert A/B for the experts' fused gate/up weight ([E, 2I, hidden], gate rows first) and
down weight, and the router's A/B, each B with its scale folded in. A per-expert gate and up
pair becomes one gate/up factor pair with block-diagonal B (zeros add exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .expert_targets import ROUTER_MODULE, MoeShape
from .targets import ResolvedTargets

# (layer, target module, expert or None) -> {"A": lora_A, "B": lora_B}
ExpertPairs = dict[tuple[int, str, int | None], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ExpertLoraModule:
    """One MoE layer's expert/router LoRA over all E experts (scale folded into each B)."""

    w13_a: torch.Tensor | None  # [E, r13, hidden]
    w13_b: torch.Tensor | None  # [E, 2I, r13]
    w2_a: torch.Tensor | None  # [E, r2, I]
    w2_b: torch.Tensor | None  # [E, hidden, r2]
    router_a: torch.Tensor | None  # [rr, hidden]
    router_b: torch.Tensor | None  # [E, rr]
    shared13_a: torch.Tensor | None = None  # [rs, hidden] (Qwen2-MoE's shared expert)
    shared13_b: torch.Tensor | None = None  # [2S, rs]
    shared2_a: torch.Tensor | None = None  # [rs2, S]
    shared2_b: torch.Tensor | None = None  # [hidden, rs2]
    shared_gate_a: torch.Tensor | None = None  # [rg, hidden]
    shared_gate_b: torch.Tensor | None = None  # [1, rg]

    def tensors(self) -> list[torch.Tensor]:
        """Its factors that are set."""
        return [t for t in vars(self).values() if isinstance(t, torch.Tensor)]

    @property
    def rank(self) -> int:
        """The largest rank of its factor pairs."""
        ranks = [t.shape[-2] for t in (self.w13_a, self.w2_a) if t is not None]
        for t in (self.router_a, self.shared13_a, self.shared2_a, self.shared_gate_a):
            if t is not None:
                ranks.append(t.shape[0])
        return max(ranks, default=0)

    @property
    def nbytes(self) -> int:
        """Host bytes of its tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _shared(
    parts: dict[str, torch.Tensor | None],
    pairs: ExpertPairs,
    targets: ResolvedTargets,
    layer: int,
    shape: MoeShape,
) -> None:
    """The shared expert's factors: gate/up as one pair with block-diagonal B, down, gate."""
    s = shape.shared_intermediate

    def scaled(module: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        found = pairs.get((layer, module, None))
        if found is None:
            return None
        factor = targets.get(layer, module).scale  # type: ignore[union-attr]  # a module with weights has a target
        return found["A"].float(), found["B"].float() * factor

    a_rows, b_cols = [], []
    for half, proj in enumerate(("gate_proj", "up_proj")):
        p = scaled(f"shared_expert.{proj}")
        if p is not None:
            b = torch.zeros(2 * s, p[1].shape[1])
            b[half * s : (half + 1) * s] = p[1]
            a_rows.append(p[0])
            b_cols.append(b)
    if a_rows:
        parts["shared13_a"], parts["shared13_b"] = torch.cat(a_rows), torch.cat(b_cols, dim=1)
    if (p := scaled("shared_expert.down_proj")) is not None:
        parts["shared2_a"], parts["shared2_b"] = p
    if (p := scaled("shared_expert_gate")) is not None:
        parts["shared_gate_a"], parts["shared_gate_b"] = p


def _fused(
    a: torch.Tensor, b: torch.Tensor, experts: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PEFT's fused [r x E, in] / [out, r x E] -> per-expert [E, r, in], [E, out, r]."""
    a_e = a.reshape(experts, -1, a.shape[-1])
    b_e = b.reshape(b.shape[0], -1, experts).permute(2, 0, 1)
    return a_e.contiguous(), (b_e * scale).contiguous()


def build_expert_modules(
    pairs: ExpertPairs,
    targets: ResolvedTargets,
    shape: MoeShape,
    dtype: torch.dtype,
) -> dict[int, ExpertLoraModule]:
    """Per-layer modules from checked (layer, target, expert) -> {"A", "B"} tensors."""
    out: dict[int, ExpertLoraModule] = {}
    e, i = shape.num_experts, shape.intermediate
    for layer in sorted({k[0] for k in pairs}):
        parts: dict[str, torch.Tensor | None] = dict.fromkeys(
            ("w13_a", "w13_b", "w2_a", "w2_b", "router_a", "router_b")
        )
        _shared(parts, pairs, targets, layer, shape)

        def scale(module: str) -> float:
            return targets.get(layer, module).scale  # type: ignore[union-attr]  # noqa: B023  # a module with weights has a target

        def pair(
            module: str, expert: int | None = None
        ) -> tuple[torch.Tensor, torch.Tensor] | None:
            found = pairs.get((layer, module, expert))  # noqa: B023
            return None if found is None else (found["A"].float(), found["B"].float())

        if (p := pair("experts.gate_up_proj")) is not None:
            parts["w13_a"], parts["w13_b"] = _fused(*p, e, scale("experts.gate_up_proj"))
        if (p := pair("experts.down_proj")) is not None:
            parts["w2_a"], parts["w2_b"] = _fused(*p, e, scale("experts.down_proj"))
        if (p := pair(ROUTER_MODULE)) is not None:
            parts["router_a"], parts["router_b"] = p[0], p[1] * scale(ROUTER_MODULE)
        gate, up = pair("per_expert.gate_proj", 0), pair("per_expert.up_proj", 0)
        if gate is not None or up is not None:
            a_rows, b_blocks = [], []
            for expert in range(e):
                a_e, b_e = [], []
                for half, proj in enumerate(("gate_proj", "up_proj")):
                    p = pair(f"per_expert.{proj}", expert)
                    if p is None:
                        continue
                    b = torch.zeros(2 * i, p[1].shape[1])
                    b[half * i : (half + 1) * i] = p[1] * scale(f"per_expert.{proj}")
                    a_e.append(p[0])
                    b_e.append(b)
                a_rows.append(torch.cat(a_e))
                b_blocks.append(torch.cat(b_e, dim=1))
            parts["w13_a"], parts["w13_b"] = torch.stack(a_rows), torch.stack(b_blocks)
        if pair("per_expert.down_proj", 0) is not None:
            down = [pair("per_expert.down_proj", x) for x in range(e)]
            s = scale("per_expert.down_proj")
            parts["w2_a"] = torch.stack([p[0] for p in down])  # type: ignore[index]  # validated: every expert has it
            parts["w2_b"] = torch.stack([p[1] * s for p in down])  # type: ignore[index]  # validated: every expert has it
        out[layer] = ExpertLoraModule(
            **{k: None if v is None else v.to(dtype).contiguous() for k, v in parts.items()}
        )
    return out

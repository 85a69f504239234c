"""The sparse MoE block: router, routed experts (local or expert-parallel), shared expert.

Plugs into the engine's `DecoderLayer(config, layer_idx, mlp)` as the `mlp`: takes and
returns flattened hidden states [T, H]. Loads both checkpoint layouts: per-expert tensors
(`experts.{i}.gate_proj|up_proj|down_proj` or Mixtral's `w1|w3|w2`) and transformers v5's
fused 3-D `experts.gate_up_proj` [E, 2I, H] / `experts.down_proj` [E, H, I].
Built with a quantized scheme (int8 / int4 / fp8), the routed and shared experts are stored
quantized (`expert_storage.py`, `quant_experts.py`): each expert tensor is quantized as it is
loaded, so the float stack is never allocated. Router and activations stay in the compute
dtype.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.moe.expert_lora import (
    ExpertLoraBatch,
    add_router_lora,
    add_token_lora,
    expert_rows_lora_torch,
    fused_experts_lora_torch,
)
from loraplex.moe.expert_parallel import ExpertParallelGroup
from loraplex.moe.expert_storage import ExpertStorage
from loraplex.moe.experts_torch import (
    expert_rows_torch,
    fused_experts_torch,
    silu_and_mul,
)
from loraplex.moe.gating import select_experts
from loraplex.moe.placement import ExpertPlacement
from loraplex.moe.quant_experts import QuantizedExperts, refuse_prequantized_expert
from loraplex.moe.spec import MoESpec
from loraplex.moe.stats import ExpertLoadRecorder

_PER_EXPERT = re.compile(r"^experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_SHARED = re.compile(r"^shared_experts?\.(gate_proj|up_proj|down_proj)\.weight$")
_GATE_HALF = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1}

# A piece of a parameter a checkpoint fills: (name,), (name, slot) or (name, slot, half).
Piece = tuple[str] | tuple[str, int] | tuple[str, int, int]


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda


class MoEBlock(ExpertStorage, nn.Module):
    """Router + routed experts (+ shared expert); under EP this rank holds only its experts."""

    # The expert stacks `ExpertStorage._stack_param` registers (codes when quantized, an
    # empty meta tensor when packed for oneDNN), and the shared expert's weights (a one-slot
    # quantized stack, or a float matrix; None without a shared expert).
    w13: nn.Parameter
    w2: nn.Parameter
    shared_w13: nn.Parameter | None
    shared_w2: nn.Parameter | None

    def __init__(
        self,
        spec: MoESpec,
        layer_idx: int = 0,
        dtype: torch.dtype = torch.float32,
        ep: ExpertParallelGroup | None = None,
        placement: ExpertPlacement | None = None,
        device: torch.device | str | None = None,
        quant: QuantScheme | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.layer_idx = layer_idx
        self.ep = ep
        if ep is not None and placement is None:
            placement = ExpertPlacement.contiguous(spec.num_experts, ep.world_size)
        if placement is not None and placement.num_experts != spec.num_experts:
            raise ValueError("placement and spec disagree on the number of experts")
        self.placement = placement
        self.load_recorder: ExpertLoadRecorder | None = None
        # This step's expert/router LoRA for this block (set by the engine's LoRA runtime).
        self.expert_lora: Callable[[MoEBlock], ExpertLoraBatch | None] | None = None
        # The engine's deterministic mode's forward for this block (fixed-order kernels),
        # used instead of the grouped kernels when set.
        self.deterministic_forward: Callable[[torch.Tensor], torch.Tensor] | None = None
        # Called (block, old, new) after a placement change, on every rank at the same step:
        # whatever else is held per local expert slot (adapters' expert slices) moves too.
        self.placement_listeners: list[
            Callable[[MoEBlock, ExpertPlacement, ExpertPlacement], None]
        ] = []
        h, i, e = spec.hidden_size, spec.intermediate_size, spec.num_experts
        # DeepSeek-V3 keeps its router in fp32 whatever the model dtype (as transformers does).
        gate_dtype = torch.float32 if self._router_fp32 else dtype
        self.gate_weight = nn.Parameter(
            torch.empty(e, h, dtype=gate_dtype, device=device), requires_grad=False
        )
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(e, dtype=torch.float32, device=device), requires_grad=False)
            if spec.correction_bias
            else None
        )
        slots = len(self.local_experts)
        self._init_storage(quant, dtype)
        self._stack_param("w13", slots, 2 * i, h, device)
        self._stack_param("w2", slots, h, i, device)
        s = spec.shared_intermediate_size
        if s and self.quant_kind is not None:  # a quantized shared expert: one-slot stacks
            self._stack_param("shared_w13", 1, 2 * s, h, device)
            self._stack_param("shared_w2", 1, h, s, device)
        else:
            self.shared_w13 = (
                nn.Parameter(torch.empty(2 * s, h, dtype=dtype, device=device), requires_grad=False)
                if s
                else None
            )
            self.shared_w2 = (
                nn.Parameter(torch.empty(h, s, dtype=dtype, device=device), requires_grad=False)
                if s
                else None
            )
        self.shared_gate = (
            nn.Parameter(torch.empty(1, h, dtype=dtype, device=device), requires_grad=False)
            if spec.shared_gated
            else None
        )

        self._missing = self._all_pieces()

    @property
    def _router_fp32(self) -> bool:
        """DeepSeek routers (and any sigmoid router) score in fp32, as transformers does."""
        return self.spec.router_fp32 or self.spec.gating.scoring == "sigmoid"

    def _all_pieces(self) -> set[Piece]:
        """Every piece of every parameter a checkpoint must fill (for completeness checks)."""
        pieces: set[Piece] = {("gate_weight",)}
        if self.e_score_correction_bias is not None:
            pieces.add(("e_score_correction_bias",))
        for slot in range(len(self.local_experts)):
            pieces |= {("w13", slot, 0), ("w13", slot, 1), ("w2", slot)}
        if self.shared_w13 is not None:
            pieces |= {("shared_w13", 0), ("shared_w13", 1), ("shared_w2",)}
        if self.shared_gate is not None:
            pieces.add(("shared_gate",))
        return pieces

    @property
    def missing_weights(self) -> list[str]:
        """Parameters not yet (fully) loaded from a checkpoint."""
        return sorted({piece[0] for piece in self._missing})

    def load_hf_weight(self, name: str, tensor: torch.Tensor) -> list[str]:
        """Engine loader hook: load `name` (relative to the block); return completed params."""
        before = set(self.missing_weights)
        if not self.load_weight(name, tensor):
            raise ValueError(f"checkpoint tensor {name!r} has no place in the MoE block")
        done = before - set(self.missing_weights)
        return sorted(done | self._filled_scales(done))  # the scales fill with their codes

    @property
    def local_experts(self) -> tuple[int, ...]:
        """Logical expert held in each local slot."""
        if self.placement is None:
            return tuple(range(self.spec.num_experts))
        rank = self.ep.rank if self.ep is not None else 0
        return self.placement.local_experts(rank)

    def _slots(self, expert: int) -> list[int]:
        return [slot for slot, e in enumerate(self.local_experts) if e == expert]

    # ---- weights -------------------------------------------------------------------------

    def load_weight(self, name: str, tensor: torch.Tensor) -> bool:
        """Load one checkpoint tensor named relative to the block; False if not ours. The
        last piece finishes the quantized experts' layout."""
        refuse_prequantized_expert(name)
        ours = self._load_piece(name, tensor)
        if ours and not self._missing:
            self._finish_loading()
        return ours

    def _load_piece(self, name: str, tensor: torch.Tensor) -> bool:
        i = self.spec.intermediate_size
        with torch.no_grad():
            if name == "gate.weight":
                self._expect(name, tensor, tuple(self.gate_weight.shape))
                self.gate_weight.copy_(tensor)
                self._missing.discard(("gate_weight",))
                return True
            if name in ("gate.e_score_correction_bias", "e_score_correction_bias"):
                if self.e_score_correction_bias is None:
                    raise ValueError(f"unexpected {name}: this block has no correction bias")
                self._expect(name, tensor, tuple(self.e_score_correction_bias.shape))
                self.e_score_correction_bias.copy_(tensor)
                self._missing.discard(("e_score_correction_bias",))
                return True
            if name == "experts.gate_up_proj":
                rows = self._fused_rows(name, tensor, (2 * i, self.spec.hidden_size))
                self._put("w13", (slice(None),), tensor[rows])
                for slot in range(self.w13.shape[0]):
                    self._missing -= {("w13", slot, 0), ("w13", slot, 1)}
                return True
            if name == "experts.down_proj":
                rows = self._fused_rows(name, tensor, (self.spec.hidden_size, i))
                self._put("w2", (slice(None),), tensor[rows])
                for slot in range(self.w2.shape[0]):
                    self._missing.discard(("w2", slot))
                return True
            match = _PER_EXPERT.match(name)
            if match:
                expert, part = int(match.group(1)), match.group(2)
                if expert >= self.spec.num_experts:
                    raise ValueError(f"{name}: expert {expert} >= {self.spec.num_experts}")
                for slot in self._slots(expert):  # empty: held by another rank
                    if part in ("w2", "down_proj"):
                        self._expect(name, tensor, (self.spec.hidden_size, i))
                        self._put("w2", (slot,), tensor)
                        self._missing.discard(("w2", slot))
                    else:
                        half = _GATE_HALF[part]
                        self._expect(name, tensor, (i, self.spec.hidden_size))
                        self._put("w13", (slot, slice(half * i, (half + 1) * i)), tensor)
                        self._missing.discard(("w13", slot, half))
                return True
            match = _SHARED.match(name)
            if match and self.shared_w13 is not None:
                s = self.spec.shared_intermediate_size
                part = match.group(1)
                lead: tuple[int, ...] = (0,) if "shared_w2" in self._stacks else ()  # 1-slot
                if part == "down_proj":
                    self._expect(name, tensor, (self.spec.hidden_size, s))
                    self._put("shared_w2", (*lead, slice(None)), tensor)
                    self._missing.discard(("shared_w2",))
                else:
                    half = _GATE_HALF[part]
                    self._expect(name, tensor, (s, self.spec.hidden_size))
                    self._put("shared_w13", (*lead, slice(half * s, (half + 1) * s)), tensor)
                    self._missing.discard(("shared_w13", half))
                return True
            if name == "shared_expert_gate.weight" and self.shared_gate is not None:
                self._expect(name, tensor, tuple(self.shared_gate.shape))
                self.shared_gate.copy_(tensor)
                self._missing.discard(("shared_gate",))
                return True
        return False

    def _fused_rows(self, name: str, tensor: torch.Tensor, inner: tuple[int, ...]) -> list[int]:
        """Rows of a fused 3-D expert tensor for each local slot.

        The tensor holds every expert ([E, ...]), or, when the loader read only this rank's
        experts' rows, just those experts in increasing order ([len(held), ...]).
        """
        held = sorted(set(self.local_experts))
        n = tensor.shape[0] if tensor.ndim else -1
        if n == self.spec.num_experts:
            self._expect(name, tensor, (n, *inner))
            return list(self.local_experts)
        self._expect(name, tensor, (len(held), *inner))
        row_of = {e: r for r, e in enumerate(held)}
        return [row_of[e] for e in self.local_experts]

    @staticmethod
    def _expect(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {shape}")

    # ---- forward -------------------------------------------------------------------------

    def route(
        self, x: torch.Tensor, lora: ExpertLoraBatch | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits (+ each token's router LoRA) -> (weights [T, k] fp32, ids [T, k])."""
        if self._router_fp32:
            logits = F.linear(x.float(), self.gate_weight.float())
        else:
            logits = F.linear(x, self.gate_weight)
        if lora is not None:
            logits = add_router_lora(logits, x, lora)
        return select_experts(logits, self.spec.gating, self.e_score_correction_bias)

    def shared(self, x: torch.Tensor, lora: ExpertLoraBatch | None = None) -> torch.Tensor | None:
        """Shared-expert output for `x` (sigmoid-gated for Qwen2-MoE), None if there is none;
        with each token's adapter's shared-expert LoRA when `lora` has one."""
        if self.shared_w13 is None or self.shared_w2 is None:
            return None
        gate_up = self._shared_linear("shared_w13", self.shared_w13, x)
        if lora is not None:
            gate_up = add_token_lora(gate_up, x, lora, "shared13")
        act = silu_and_mul(gate_up)
        out = self._shared_linear("shared_w2", self.shared_w2, act)
        if lora is not None:
            out = add_token_lora(out, act, lora, "shared2")
        if self.shared_gate is not None:
            gate = F.linear(x, self.shared_gate)
            if lora is not None:
                gate = add_token_lora(gate, x, lora, "shared_gate")
            out = torch.sigmoid(gate) * out
        return out

    def _shared_linear(self, name: str, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x @ W^T for a shared-expert weight: a quantized one-slot stack, or a float matrix."""
        if name not in self._stacks:
            return F.linear(x, weight)
        stack = self.stack(name)
        if not isinstance(stack, QuantizedExperts):  # only quantized shared experts are stacks
            raise TypeError(f"{name}: a shared-expert stack holds quantized codes")
        return stack.matmul(x, 0)

    def _routed_local(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        lora: ExpertLoraBatch | None = None,
    ) -> torch.Tensor:
        w13, w2 = self.stack("w13"), self.stack("w2")
        if lora is not None:  # adapters' expert deltas inside the grouped GEMMs
            if _use_triton(x) and isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor):
                from loraplex.moe.expert_lora_triton import fused_experts_lora_triton

                return fused_experts_lora_triton(x, w13, w2, weights, ids, lora)
            return fused_experts_lora_torch(x, w13, w2, weights, ids, lora)
        if _use_triton(x):
            from loraplex.moe.experts_triton import fused_experts_triton

            return fused_experts_triton(x, w13, w2, weights, ids)
        return fused_experts_torch(x, w13, w2, weights, ids)

    def _rows(self, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        w13, w2 = self.stack("w13"), self.stack("w2")
        if _use_triton(rows):
            from loraplex.moe.experts_triton import fused_experts_triton

            ones = torch.ones(rows.shape[0], 1, dtype=torch.float32, device=rows.device)
            return fused_experts_triton(rows, w13, w2, ones, slots.unsqueeze(1))
        return expert_rows_torch(rows, slots, w13, w2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]."""
        if self.deterministic_forward is not None:
            return self.deterministic_forward(x)
        lora = self.expert_lora(self) if self.expert_lora is not None else None
        if self.ep is None or self.placement is None:  # __init__ gives an EP block a placement
            weights, ids = self.route(x, lora)
            if self.load_recorder is not None:
                self.load_recorder.record(self.layer_idx, ids)
            out = self._routed_local(x, weights, ids, lora)
            shared = self.shared(x, lora)
            return out if shared is None else out + shared
        ep, placement = self.ep, self.placement
        bounds = ep.token_bounds(x.shape[0])
        start, end = bounds[ep.rank], bounds[ep.rank + 1]
        x_local = x[start:end]
        lora_local = lora.rows(start, end) if lora is not None else None
        weights, ids = self.route(x_local, lora_local)
        if self.load_recorder is not None:
            self.load_recorder.record(self.layer_idx, ids)
        if lora is None or lora_local is None:
            out = ep.dispatch_combine(
                x_local, weights, ids, placement, self._rows, pair_offset=start * ids.shape[1]
            )
        else:  # rows travel with their token's adapter slot; slots are the same on every rank
            w13, w2 = self.stack("w13"), self.stack("w2")
            adapter_slots = lora.slots

            def rows_lora(
                rows: torch.Tensor, slots: torch.Tensor, tags: torch.Tensor
            ) -> torch.Tensor:
                return expert_rows_lora_torch(rows, slots, tags, w13, w2, adapter_slots)

            out = ep.dispatch_combine(
                x_local, weights, ids, placement, rows_lora,
                pair_offset=start * ids.shape[1], token_tags=lora_local.token_slot,
            )  # fmt: skip
        shared = self.shared(x_local, lora_local)
        if shared is not None:
            out = out + shared
        return ep.all_gather_tokens(out, bounds)

    def apply_placement(self, placement: ExpertPlacement) -> None:
        """Switch to a new expert placement between steps, moving weights between ranks.

        Collective under EP: every rank calls it at the same step boundary; requests in
        flight keep their KV cache and simply use the new placement from the next step.
        """
        if placement.num_experts != self.spec.num_experts:
            raise ValueError("new placement has a different number of experts")
        if self.ep is None or self.placement is None:  # __init__ gives an EP block a placement
            raise ValueError("placement changes need an expert-parallel group")
        names = ["w13", "w2"] + (["w13_scale", "w2_scale"] if self.quant_kind else [])
        tensors = [self.dense_stack(n).contiguous() for n in names]
        # one byte stream per slot, whatever the dtypes (codes, scales, fp8)
        moved = self.ep.migrate_experts(
            self.placement, placement, [t.view(torch.uint8) for t in tensors]
        )
        old, self.placement = self.placement, placement
        for n, t, raw in zip(names, tensors, moved, strict=True):
            self.set_stack(n, raw.view(t.dtype))
        for listener in self.placement_listeners:
            listener(self, old, placement)

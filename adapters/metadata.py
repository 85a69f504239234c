"""Per-step LoRA metadata, built once per engine step and read by every LoRA-targeted Linear.

Tokens are grouped by adapter: each active adapter gets a *step slot* (0..n-1, in order of
first appearance); tokens with no adapter get slot -1. The device tensors have fixed shapes
(`[max_loras]`, `[num_linears, max_slices, max_loras]`) so a captured CUDA graph can replay
with new contents; the host-side `groups` drive the CPU torch path without per-token loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.adapters.device_pool import Resident


@dataclass
class LoraGroup:
    """One active adapter's share of the step (host side)."""

    slot: int
    row_start: int
    ranks: list[list[int]]  # [linear][slice]
    scales: list[list[float]]  # [linear][slice]
    runs: list[tuple[int, int]]  # its token ranges [start, end) in batch order
    token_idx: torch.Tensor | None  # int64 token indices when there is more than one run
    sorted_start: int
    num_tokens: int
    key: str = ""  # the adapter version's key (content hash)
    rows: int = 0  # pool rows the adapter spans (its largest rank)


@dataclass
class LoraBatchMeta:
    """Everything the shrink/expand kernels need for one step."""

    num_tokens: int
    max_loras: int
    token_slot: torch.Tensor  # [T] int32, -1 = base model only
    sorted_token_ids: torch.Tensor  # [T] int32: adapter tokens grouped by slot, then the rest
    active_slots: torch.Tensor  # [max_loras] int32: slot id, or -1 past the active ones
    slot_num_tokens: torch.Tensor  # [max_loras] int32
    slot_start: torch.Tensor  # [max_loras] int32: offset of each slot's run in sorted_token_ids
    slot_row_start: torch.Tensor  # [max_loras] int32: first pool row of the slot's adapter
    ranks: torch.Tensor  # [num_linears, max_slices, max_loras] int32
    scales: torch.Tensor  # [num_linears, max_slices, max_loras] float32
    max_rank: int
    max_tokens_per_slot: int
    groups: list[LoraGroup]
    # The gathered CPU path's chunking of this step (`kernels.lora_sgmv.SgmvPlan`), built
    # lazily by the first Linear that needs it and shared by the rest of the step.
    sgmv_plan: object | None = None
    # The native CPU kernel's per-step arguments (`kernels.lora_cpu.LoraStepArgs`), likewise
    # built once.
    native_step: object | None = None
    # Set when a step's adapter has LoRA on MoE experts / router: those deltas run in the
    # blocks' Python forward, so the step runs eager (a captured decode graph would skip them).
    eager_only: bool = False

    @property
    def num_active(self) -> int:
        """Adapters with tokens in this step."""
        return len(self.groups)


def build_lora_meta(
    seqs: Sequence[tuple[Resident | None, int]],
    *,
    max_loras: int,
    num_linears: int,
    max_slices: int,
    device: torch.device | str = "cpu",
    num_tokens: int | None = None,
) -> LoraBatchMeta:
    """Build a step's metadata from each scheduled sequence's (resident adapter, token count).

    Sequences are in batch order (their tokens contiguous). `num_tokens` may exceed the sum to
    pad the batch (padding tokens get slot -1). Raises ValueError past `max_loras` adapters.
    """
    total = sum(n for _, n in seqs)
    num_tokens = total if num_tokens is None else num_tokens
    if num_tokens < total:
        raise ValueError(f"num_tokens={num_tokens} is less than the {total} scheduled tokens")
    slot_of: dict[str, int] = {}
    residents: list[Resident] = []
    runs: list[list[tuple[int, int]]] = []
    token_slot = [-1] * num_tokens
    pos = 0
    for resident, n in seqs:
        if resident is not None and n > 0:
            slot = slot_of.get(resident.key)
            if slot is None:
                slot = slot_of[resident.key] = len(residents)
                if slot >= max_loras:
                    raise ValueError(f"more than max_loras={max_loras} adapters in one step")
                residents.append(resident)
                runs.append([])
            if runs[slot] and runs[slot][-1][1] == pos:
                runs[slot][-1] = (runs[slot][-1][0], pos + n)
            else:
                runs[slot].append((pos, pos + n))
            token_slot[pos : pos + n] = [slot] * n
        pos += n

    sorted_ids: list[int] = []
    groups: list[LoraGroup] = []
    for slot, (resident, slot_runs) in enumerate(zip(residents, runs, strict=True)):
        start = len(sorted_ids)
        for s, e in slot_runs:
            sorted_ids.extend(range(s, e))
        count = len(sorted_ids) - start
        idx = None
        if len(slot_runs) > 1:
            idx = torch.tensor(sorted_ids[start:], dtype=torch.int64, device=device)
        groups.append(
            LoraGroup(
                slot=slot,
                row_start=resident.row_start,
                ranks=resident.ranks,
                scales=resident.scales,
                runs=slot_runs,
                token_idx=idx,
                sorted_start=start,
                num_tokens=count,
                key=resident.key,
                rows=resident.rows,
            )
        )
    sorted_ids.extend(t for t in range(num_tokens) if token_slot[t] == -1)

    n_active = len(groups)
    pad = max_loras - n_active
    ranks = torch.zeros(num_linears, max_slices, max_loras, dtype=torch.int32)
    scales = torch.zeros(num_linears, max_slices, max_loras, dtype=torch.float32)
    if residents:
        ranks[:, :, :n_active] = torch.stack([r.ranks_t for r in residents], dim=-1)
        scales[:, :, :n_active] = torch.stack([r.scales_t for r in residents], dim=-1)

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return LoraBatchMeta(
        num_tokens=num_tokens,
        max_loras=max_loras,
        token_slot=i32(token_slot),
        sorted_token_ids=i32(sorted_ids),
        active_slots=i32(list(range(n_active)) + [-1] * pad),
        slot_num_tokens=i32([g.num_tokens for g in groups] + [0] * pad),
        slot_start=i32([g.sorted_start for g in groups] + [0] * pad),
        slot_row_start=i32([g.row_start for g in groups] + [0] * pad),
        ranks=ranks.to(device),
        scales=scales.to(device),
        max_rank=max((r.rows for r in residents), default=0),
        max_tokens_per_slot=max((g.num_tokens for g in groups), default=0),
        groups=groups,
    )

"""Persistent LoRA metadata buffers for CUDA-graph decode steps (the graph-static twin of
`LoraBatchMeta`).

A captured graph bakes in tensor addresses, so the LoRA metadata it reads must live in buffers
that outlive every step. `StaticLoraMeta` holds them, sized for the largest captured batch:
`token_slot` and `sorted_token_ids` `[max_batch]`, the `[max_loras]` slot tables and the
`[num_linears, max_slices, max_loras]` rank/scale tables. Before each replay `copy_from(meta)`
copies a step's `LoraBatchMeta` in place (device to device, no host sync) and marks rows past
the live batch as padding (slot -1); `clear()` makes a base-only step (every slot -1, so the
kernels' programs all exit). `view(b)` is what one captured size reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loraplex.adapters.metadata import LoraBatchMeta


@dataclass
class StaticLoraView:
    """The attributes the Triton shrink/expand launches read, over the first `num_tokens` rows.

    Every tensor is (a view of) a `StaticLoraMeta` buffer; the host ints are fixed for the
    capture (`max_loras`, `max_rank` = the runtime's `max_lora_rank`), never per step.
    """

    num_tokens: int
    max_loras: int
    max_rank: int
    token_slot: torch.Tensor
    sorted_token_ids: torch.Tensor
    active_slots: torch.Tensor
    slot_num_tokens: torch.Tensor
    slot_start: torch.Tensor
    slot_row_start: torch.Tensor
    ranks: torch.Tensor
    scales: torch.Tensor


class StaticLoraMeta:
    """Fixed-address LoRA metadata for decode graphs of up to `max_batch` rows."""

    def __init__(
        self,
        max_batch: int,
        *,
        max_loras: int,
        num_linears: int,
        max_slices: int,
        max_rank: int,
        device: torch.device | str = "cpu",
    ) -> None:
        if max_batch < 1 or max_loras < 1 or max_rank < 1:
            raise ValueError("max_batch, max_loras and max_rank must all be >= 1")
        self.max_batch = max_batch
        self.max_loras = max_loras
        self.num_linears = num_linears
        self.max_slices = max_slices
        self.max_rank = max_rank
        dev = torch.device(device)
        i32: dict[str, Any] = dict(dtype=torch.int32, device=dev)
        self._arange = torch.arange(max_batch, **i32)
        self.token_slot = torch.full((max_batch,), -1, **i32)
        self.sorted_token_ids = self._arange.clone()
        self.active_slots = torch.full((max_loras,), -1, **i32)
        self.slot_num_tokens = torch.zeros(max_loras, **i32)
        self.slot_start = torch.zeros(max_loras, **i32)
        self.slot_row_start = torch.zeros(max_loras, **i32)
        self.ranks = torch.zeros(num_linears, max_slices, max_loras, **i32)
        self.scales = torch.zeros(
            num_linears, max_slices, max_loras, dtype=torch.float32, device=dev
        )

    def view(self, batch_size: int) -> StaticLoraView:
        """What a graph captured for `batch_size` rows reads (views of these buffers)."""
        if not 1 <= batch_size <= self.max_batch:
            raise ValueError(f"batch_size {batch_size} is outside 1..{self.max_batch}")
        return StaticLoraView(
            num_tokens=batch_size,
            max_loras=self.max_loras,
            max_rank=self.max_rank,
            token_slot=self.token_slot[:batch_size],
            sorted_token_ids=self.sorted_token_ids[:batch_size],
            active_slots=self.active_slots,
            slot_num_tokens=self.slot_num_tokens,
            slot_start=self.slot_start,
            slot_row_start=self.slot_row_start,
            ranks=self.ranks,
            scales=self.scales,
        )

    def clear(self) -> None:
        """A base-only step: no active slot, every row slot -1."""
        self.token_slot.fill_(-1)
        self.sorted_token_ids.copy_(self._arange)
        self.active_slots.fill_(-1)
        self.slot_num_tokens.zero_()

    def copy_from(self, meta: LoraBatchMeta, batch_size: int | None = None) -> None:
        """Copy a step's metadata in place; rows `meta.num_tokens..batch_size` become padding.

        Raises ValueError when the step does not fit the buffers (more rows, other `max_loras`
        or table shapes, or an adapter rank above `max_rank`).
        """
        n = meta.num_tokens
        b = self.max_batch if batch_size is None else batch_size
        if not n <= b <= self.max_batch:
            raise ValueError(f"{n} rows do not fit a static batch of {b} (max {self.max_batch})")
        if meta.max_loras != self.max_loras or tuple(meta.ranks.shape) != tuple(self.ranks.shape):
            raise ValueError(
                f"metadata for max_loras={meta.max_loras}, tables {tuple(meta.ranks.shape)} "
                f"do not match the static buffers ({self.max_loras}, {tuple(self.ranks.shape)})"
            )
        if meta.max_rank > self.max_rank:
            raise ValueError(f"adapter rank {meta.max_rank} exceeds max_rank={self.max_rank}")
        self.token_slot[:n].copy_(meta.token_slot, non_blocking=True)
        self.token_slot[n:b].fill_(-1)
        self.sorted_token_ids[:n].copy_(meta.sorted_token_ids, non_blocking=True)
        self.sorted_token_ids[n:b].copy_(self._arange[n:b])
        self.active_slots.copy_(meta.active_slots, non_blocking=True)
        self.slot_num_tokens.copy_(meta.slot_num_tokens, non_blocking=True)
        self.slot_start.copy_(meta.slot_start, non_blocking=True)
        self.slot_row_start.copy_(meta.slot_row_start, non_blocking=True)
        self.ranks.copy_(meta.ranks, non_blocking=True)
        self.scales.copy_(meta.scales, non_blocking=True)

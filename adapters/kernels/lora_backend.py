"""The LoRA kernel backend: one Protocol for the five delta paths, and the choice made once.

Every path adds one step's adapter deltas for one Linear into its output in place, reading
the adapters' weights from the device pool; they differ in kernels only. The engine picks one
when it builds its LoRA hooks (`choose_lora_backend`: device, dtype, rank, deterministic mode)
and calls it through `LoraBackend` from then on, as vLLM's Punica wrapper and SGLang's LoRA
backends are chosen once: Triton on CUDA; on a CPU the native kernel where it builds and reads
the dtype, else the packed GEMMs. The per-adapter torch path and plain SGMV stay as references
the others are tested against.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.metadata import LoraBatchMeta


@runtime_checkable
class LoraBackend(Protocol):
    """Adds a step's adapter deltas for one Linear into its output."""

    name: str

    def delta(
        self,
        lid: int,
        x: torch.Tensor,
        y: torch.Tensor,
        meta: LoraBatchMeta,
        pool: DevicePool,
        spec: LoraLinearSpec,
    ) -> None:
        """Add every adapter token's delta for Linear `lid` (input `x` [T, in]) into `y`
        [T, out] in place, from the pool's A and B buffers of that Linear."""
        ...


class SliceBounds:
    """Each Linear's int32 slice offsets and sizes on the device, built once per Linear (the
    Triton and native kernels read them; a captured graph bakes their addresses in)."""

    def __init__(self, specs: list[LoraLinearSpec], device: torch.device) -> None:
        self.specs = specs
        self.device = device
        self._tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, lid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear `lid`'s (offsets, sizes)."""
        st = self._tensors.get(lid)
        if st is None:
            spec = self.specs[lid]
            st = self._tensors[lid] = (
                torch.tensor(spec.slice_offsets, dtype=torch.int32, device=self.device),
                torch.tensor(spec.slice_sizes, dtype=torch.int32, device=self.device),
            )
        return st

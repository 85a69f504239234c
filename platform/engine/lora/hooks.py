"""The model side of multi-LoRA: hooks on the model's Linear modules and the kernel choice.

Every LoRA-targetable `Linear` (its slices are modules a PEFT adapter may target) gets a
`lora_delta` hook. Each call reads the step's metadata from the forward context and adds the
adapters' low-rank deltas into the output in place, with the fastest path for the device and
batch: the Triton shrink/expand on a GPU (graph-static for captured decode steps); on a CPU the
native per-token kernel (`kernels.lora_cpu`, pool rows read in place) where it builds, else the
packed SGMV-style path (`kernels.lora_packed`): the step's adapter tokens in chunks, two
batched GEMMs per Linear over chunk weights packed once per adapter layout and kept while
decode steps repeat it. Neither CPU path's cost grows with the number of distinct adapters.
Weights come from the device pool the tiers own (`weights()`), read at call time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.kernels.lora_cpu import (
    NativeLoraLinear,
    native_lora_available,
    native_lora_status,
)
from loraplex.adapters.kernels.lora_packed import PackCache, lora_compute_dtype, lora_delta_packed
from loraplex.adapters.kernels.lora_sgmv import SgmvPlan, build_sgmv_plan
from loraplex.adapters.kernels.lora_triton import (
    lora_delta_triton,
    lora_delta_triton_static,
    triton_lora_available,
)
from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.adapters.peft_format import module_dims
from loraplex.adapters.static_meta import StaticLoraView
from loraplex.platform.engine.forward_context import peek_forward_context
from loraplex.platform.engine.layers.linear import Linear


def lora_linears(model: nn.Module, hf_config: dict) -> list[tuple[Linear, LoraLinearSpec]]:
    """The model's LoRA-targetable Linears (every slice a module adapters may target), in
    module order, each with the spec the device pool lays its weights out by."""
    dims = module_dims(hf_config)
    found = [
        (
            m,
            LoraLinearSpec(m.layer_idx, tuple(m.slice_names), m.in_features, tuple(m.slice_sizes)),
        )
        for m in model.modules()
        if isinstance(m, Linear) and all(n in dims for n in m.slice_names)
    ]
    if not found:
        raise ValueError("the model has no LoRA-targetable Linear modules")
    return found


class LoraHooks:
    """Owns the `lora_delta` hooks of one model and picks the kernel for each call."""

    def __init__(
        self,
        linears: list[tuple[Linear, LoraLinearSpec]],
        weights: Callable[[], DevicePool],
        max_lora_rank: int,
        device: torch.device,
        pack_cache_bytes: int = 256 << 20,
    ) -> None:
        self.modules = [m for m, _ in linears]
        self.specs = [s for _, s in linears]
        self.max_lora_rank = max_lora_rank
        self.device = device
        self._weights = weights
        self._slice_tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._native: dict[int, NativeLoraLinear] = {}
        self.packs = PackCache(pack_cache_bytes)
        # The deterministic mode: only the per-token native kernel is batch-invariant.
        self.fixed_order = False
        for lid, module in enumerate(self.modules):
            module.lora_delta = functools.partial(self._delta, lid)

    def detach(self) -> None:
        """Remove the hooks: the model serves the base alone again."""
        for module in self.modules:
            module.lora_delta = None

    def _delta(self, lid: int, x: torch.Tensor, y: torch.Tensor, module: Linear) -> None:
        ctx = peek_forward_context()
        meta = ctx.lora if ctx is not None else None
        if isinstance(meta, StaticLoraView):  # a decode step captured as a CUDA graph
            self.static_delta(lid, x, y, meta)
            return
        if not isinstance(meta, LoraBatchMeta) or not meta.groups:
            return
        pool = self._weights()
        spec = self.specs[lid]
        if triton_lora_available(x):
            lora_delta_triton(
                x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets,
                spec.slice_sizes, self.max_lora_rank, self.slice_tensors(lid),
            )  # fmt: skip
        elif (native := self.native_linear(lid, x, pool)) is not None:
            native(x, y, meta, lid)
        elif self.fixed_order:
            raise NotImplementedError(
                "the deterministic mode serves adapters through the native CPU LoRA kernel only "
                f"({native_lora_status()})"
            )
        else:
            dtype = lora_compute_dtype(x)
            if meta.sgmv_plan is None:
                meta.sgmv_plan = build_sgmv_plan(meta, pool.num_rows, dtype)
            plan = cast("SgmvPlan | None", meta.sgmv_plan)  # only build_sgmv_plan sets it
            if plan is None:  # the active adapters have no tokens this step
                return
            packed = self.packs.get(
                lid, pool.a[lid], pool.b[lid], plan, spec.slice_offsets, spec.slice_sizes, dtype
            )
            lora_delta_packed(x, y, packed, plan)

    def native_linear(self, lid: int, x: torch.Tensor, pool: DevicePool) -> NativeLoraLinear | None:
        """Linear `lid`'s native CPU kernel arguments, built on first use and again if the pool's
        buffers moved; None where the native kernel does not serve these tensors."""
        native = self._native.get(lid)
        a, b = pool.a[lid], pool.b[lid]
        if native is not None and native.serves(a, b):
            return native
        if not native_lora_available(x, a, self.max_lora_rank):
            return None
        native = self._native[lid] = NativeLoraLinear(a, b, self.slice_tensors(lid))
        return native

    def slice_tensors(self, lid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear `lid`'s int32 slice offsets and sizes on the device (built once)."""
        st = self._slice_tensors.get(lid)
        if st is None:
            spec = self.specs[lid]
            st = self._slice_tensors[lid] = (
                torch.tensor(spec.slice_offsets, dtype=torch.int32, device=self.device),
                torch.tensor(spec.slice_sizes, dtype=torch.int32, device=self.device),
            )
        return st

    def static_delta(
        self, lid: int, x: torch.Tensor, y: torch.Tensor, meta: StaticLoraView
    ) -> None:
        """Linear `lid`'s delta over graph-static metadata: fixed launches, no host reads
        (the decode-graph path; the pool and slice tensors must exist before capture)."""
        pool = self._weights()
        lora_delta_triton_static(
            x, y, pool.a[lid], pool.b[lid], meta, lid, self.specs[lid].slice_sizes,
            self.slice_tensors(lid),
        )  # fmt: skip

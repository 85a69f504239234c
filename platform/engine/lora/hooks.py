"""The model side of multi-LoRA: hooks on the model's Linear modules and the kernel choice.

Every LoRA-targetable `Linear` (its slices are modules a PEFT adapter may target) gets a
`lora_delta` hook. Each call reads the step's metadata from the forward context and adds the
adapters' low-rank deltas into the output in place through one `LoraBackend`, chosen once when
the hooks are built (`choose_lora_backend`, as vLLM's Punica wrapper is): the Triton
shrink/expand on a GPU (graph-static for captured decode steps); on a CPU the native per-token
kernel (`kernels.lora_cpu`, pool rows read in place) where it builds and reads the model's
dtype, else the packed SGMV-style path (`kernels.lora_packed`): the step's adapter tokens in
chunks, two batched GEMMs per Linear over chunk weights packed once per adapter layout and kept
while decode steps repeat it. Neither CPU path's cost grows with the number of distinct
adapters. Weights come from the device pool the tiers own (`weights()`), read at call time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.kernels.lora_backend import LoraBackend, SliceBounds
from loraplex.adapters.kernels.lora_cpu import NativeLora, native_lora_serves, native_lora_status
from loraplex.adapters.kernels.lora_packed import PackedLora
from loraplex.adapters.kernels.lora_triton import HAS_TRITON, TritonLora, lora_delta_triton_static
from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.adapters.peft_format import module_dims
from loraplex.adapters.static_meta import StaticLoraView
from loraplex.platform.engine.forward_context import peek_forward_context
from loraplex.platform.engine.layers.linear import Linear


def lora_linears(
    model: nn.Module, hf_config: dict[str, Any]
) -> list[tuple[Linear, LoraLinearSpec]]:
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


class RefusedLora:
    """The deterministic mode where the native kernel cannot serve: every adapter step is
    refused, naming why (only the per-token native kernel is batch-invariant)."""

    name = "refused"

    def __init__(self, why: str) -> None:
        self.why = why

    def delta(
        self,
        lid: int,
        x: torch.Tensor,
        y: torch.Tensor,
        meta: LoraBatchMeta,
        pool: DevicePool,
        spec: LoraLinearSpec,
    ) -> None:
        """Refuse: the deterministic mode has no LoRA kernel here."""
        raise NotImplementedError(
            "the deterministic mode serves adapters through the native CPU LoRA kernel only "
            f"({self.why})"
        )


def choose_lora_backend(
    device: torch.device,
    dtype: torch.dtype,
    max_rank: int,
    bounds: SliceBounds,
    *,
    fixed_order: bool,
    pack_cache_bytes: int = 256 << 20,
) -> LoraBackend:
    """The LoRA kernels for a model on `device` in `dtype` (called once, at engine build)."""
    if HAS_TRITON and device.type == "cuda":
        return TritonLora(bounds, max_rank)
    if native_lora_serves(device, dtype, max_rank):
        return NativeLora(bounds)
    if fixed_order:
        return RefusedLora(f"{native_lora_status()}; dtype {dtype}, max rank {max_rank}")
    return PackedLora(pack_cache_bytes)


ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _model_dtype(modules: list[Linear]) -> torch.dtype:
    """The activations' dtype, read from the Linears: a bias, else a plain weight, else any
    parameter in an activation dtype (a quantized weight's codes never are; its scales may be
    fp32 where the model is bf16, which the CPU kernels read alike)."""
    biases = [m.bias for m in modules if m.bias is not None]
    plain = [m.weight for m in modules if m.quant_method is None]
    rest = [p for m in modules for p in m.parameters()]
    for p in (*biases, *plain, *rest):
        if p.dtype in ACTIVATION_DTYPES:
            return p.dtype
    return torch.get_default_dtype()


class LoraHooks:
    """Owns the `lora_delta` hooks of one model and the one backend they call."""

    def __init__(
        self,
        linears: list[tuple[Linear, LoraLinearSpec]],
        weights: Callable[[], DevicePool],
        max_lora_rank: int,
        device: torch.device,
        pack_cache_bytes: int = 256 << 20,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.modules = [m for m, _ in linears]
        self.specs = [s for _, s in linears]
        self.max_lora_rank = max_lora_rank
        self.device = device
        self.dtype = dtype if dtype is not None else _model_dtype(self.modules)
        self.pack_cache_bytes = pack_cache_bytes
        self._weights = weights
        self.bounds = SliceBounds(self.specs, device)
        self._fixed_order = False
        self.backend = self._choose()
        for lid, module in enumerate(self.modules):
            module.lora_delta = functools.partial(self._delta, lid)

    def _choose(self) -> LoraBackend:
        return choose_lora_backend(
            self.device, self.dtype, self.max_lora_rank, self.bounds,
            fixed_order=self._fixed_order, pack_cache_bytes=self.pack_cache_bytes,
        )  # fmt: skip

    @property
    def fixed_order(self) -> bool:
        """The deterministic mode: only the per-token native kernel is batch-invariant."""
        return self._fixed_order

    @fixed_order.setter
    def fixed_order(self, on: bool) -> None:
        """Set at engine build (`LoraRuntime.for_engine`): the backend is chosen again for it."""
        self._fixed_order = on
        self.backend = self._choose()

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
        self.backend.delta(lid, x, y, meta, self._weights(), self.specs[lid])

    def slice_tensors(self, lid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear `lid`'s int32 slice offsets and sizes on the device (built once)."""
        return self.bounds.get(lid)

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


if TYPE_CHECKING:  # mypy checks every implementation against the Protocol
    from loraplex.adapters.kernels.lora_sgmv import SgmvLora
    from loraplex.adapters.kernels.lora_torch import TorchLora

    _BACKENDS: tuple[LoraBackend, ...] = (
        TorchLora(),
        SgmvLora(),
        PackedLora(),
        NativeLora(SliceBounds([], torch.device("cpu"))),
        TritonLora(SliceBounds([], torch.device("cpu")), 1),
        RefusedLora(""),
    )

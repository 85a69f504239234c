"""The paged-attention backend: one Protocol, its implementations, and the choice made once.

Every implementation writes a step's K/V into the paged cache by slot and attends a mixed
batch through the block tables; they differ in kernels only. `choose_attention_backend` picks
one per layer when `allocate_kv_cache` binds the cache (its device and dtype decide), and the
layer calls it through the Protocol from then on, as vLLM's attention backends are chosen:
CUDA with triton -> `TritonAttention`; a CPU float cache (fp32, bf16) where the native kernel
builds -> `NativeCpuAttention` (or `FixedOrderAttention` in the deterministic mode); anything
else (fp8, fp16, no compiler) -> `TorchAttention`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.fixed_order_attention import fixed_order_attention
from loraplex.platform.engine.layers.paged_attention_cpu import (
    DTYPE_CODES,
    LIBRARY,
    native_decode_attention,
    native_write_kv,
)
from loraplex.platform.engine.layers.paged_attention_torch import (
    KVScales,
    TorchAttention,
    paged_attention_torch,
)
from loraplex.platform.engine.layers.paged_attention_triton import (
    TritonAttention,
    triton_available_for,
)


@runtime_checkable
class AttentionBackend(Protocol):
    """Writes new K/V into a layer's paged cache and attends over it."""

    name: str

    def write_kv(
        self,
        kv_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
        scales: KVScales,
    ) -> None:
        """Store k, v [T, Hkv, D] at their slots of kv_cache [2, N, bs, Hkv, D] (-1 skipped)."""
        ...

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
        scales: KVScales,
    ) -> torch.Tensor:
        """q [T, Hq, D] of a mixed batch (this step's K/V already written) -> out [T, Hq, D]."""
        ...


class NativeCpuAttention:
    """A CPU fp32/bf16 cache: the native KV write and decode kernel reading blocks in place,
    prefill chunks through the torch path (a float cache has no scales to apply)."""

    name = "native_cpu"

    def write_kv(
        self,
        kv_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
        scales: KVScales,
    ) -> None:
        """Store k, v [T, Hkv, D] at their slots (slot -1 skipped)."""
        native_write_kv(kv_cache, k, v, slot_mapping)

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
        scales: KVScales,
    ) -> torch.Tensor:
        """q [T, Hq, D] of a mixed batch (K/V written) -> out [T, Hq, D]."""
        return paged_attention_torch(q, kv_cache, md, scale, native_decode_attention)


class FixedOrderAttention(NativeCpuAttention):
    """The deterministic mode: every query token alone through the native decode kernel, in one
    order, whatever its batch (`fixed_order_attention`)."""

    name = "fixed_order"

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
        scales: KVScales,
    ) -> torch.Tensor:
        """q [T, Hq, D] (K/V written) -> out [T, Hq, D], each token attended alone."""
        return fixed_order_attention(q, kv_cache, md, scale)


def native_serves(kv_cache: torch.Tensor) -> bool:
    """Whether the native CPU kernels read this cache (CPU, fp32 or bf16, library built)."""
    return kv_cache.device.type == "cpu" and kv_cache.dtype in DTYPE_CODES and LIBRARY.available


def choose_attention_backend(kv_cache: torch.Tensor, *, fixed_order: bool) -> AttentionBackend:
    """The backend for a layer bound to `kv_cache`; called once, when the cache is bound."""
    if fixed_order:
        if not native_serves(kv_cache):
            raise NotImplementedError(
                "the deterministic mode needs the native CPU attention kernel over an fp32 or "
                f"bf16 CPU cache (got {kv_cache.dtype} on {kv_cache.device}; {LIBRARY.error})"
            )
        return FixedOrderAttention()
    if triton_available_for(kv_cache):
        return TritonAttention()
    if native_serves(kv_cache):
        return NativeCpuAttention()
    return TorchAttention()


if TYPE_CHECKING:  # mypy checks every implementation against the Protocol
    _BACKENDS: tuple[AttentionBackend, ...] = (
        TorchAttention(),
        TritonAttention(),
        NativeCpuAttention(),
        FixedOrderAttention(),
    )

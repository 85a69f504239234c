"""The CPU stacked-LoRA path: every active adapter of a step in a few large ops per Linear.

At small batches (decode) the per-adapter loop costs a gather, matmuls and a scatter per
adapter per Linear; stacking the step's adapters into one A and one B per slice turns that
into `2 + num_slices` ops, at the price of multiplying the masked-out adapters' zeros. The
stacked copies are cached per set of active adapters, keyed by their content hashes, so a
cached copy stays right wherever the pool keeps the rows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.kernels.lora_torch import (
    dense_is_cheaper,
    dense_token_mask,
    lora_delta_torch_dense,
    stack_dense_weights,
)
from loraplex.adapters.metadata import LoraBatchMeta

DENSE_CACHE_SETS = 4  # active-adapter sets whose stacked weights are kept between steps


class DenseLoraPath:
    """Decides per Linear and step whether to stack, and runs the stacked delta."""

    def __init__(self, specs: list[LoraLinearSpec], pool: Callable[[], DevicePool]) -> None:
        self.specs = specs
        self._pool = pool
        self._cache: OrderedDict[tuple[str, ...], dict[int, tuple]] = OrderedDict()

    def try_delta(self, lid: int, x: torch.Tensor, y: torch.Tensor, meta: LoraBatchMeta) -> bool:
        """Add Linear `lid`'s delta into `y` if stacking is cheaper this step; False if not."""
        spec = self.specs[lid]
        if not dense_is_cheaper(
            meta, x.shape[0], spec.in_features, y.shape[1], len(spec.slice_sizes)
        ):
            return False
        a_stack, b_stack = self._weights(meta, lid)
        if meta.dense_mask is None:
            meta.dense_mask = dense_token_mask(meta, x.dtype)
        lora_delta_torch_dense(
            x, y, a_stack, b_stack, meta.dense_mask, spec.slice_offsets, spec.slice_sizes
        )
        return True

    def _weights(self, meta: LoraBatchMeta, lid: int) -> tuple:
        key = tuple(g.key for g in meta.groups)
        per_lid = self._cache.get(key)
        if per_lid is None:
            per_lid = self._cache[key] = {}
            while len(self._cache) > DENSE_CACHE_SETS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        w = per_lid.get(lid)
        if w is None:
            spec, pool = self.specs[lid], self._pool()
            w = per_lid[lid] = stack_dense_weights(
                pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes
            )
        return w

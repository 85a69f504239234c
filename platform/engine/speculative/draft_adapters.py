"""Draft adapters (`method="draft_adapter"`): small LoRAs for the draft model, each tied to a
target adapter version, served by a multi-LoRA runtime of their own on the draft model.

A draft adapter is registered for a target adapter's version key and loaded like any adapter
(validated against the draft model's modules); once on the device it stays held while it is
registered, and the draft rows of that target adapter's requests run with it.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from loraplex.platform.engine.lora import LoraRuntime
from loraplex.platform.engine.request import Request


class DraftAdapters:
    """Target adapter version key -> the draft adapter drafting for it."""

    def __init__(self, model: nn.Module, max_loras: int = 16, max_lora_rank: int = 64) -> None:
        self.runtime = LoraRuntime(model, max_loras=max_loras, max_lora_rank=max_lora_rank)
        self._tied: dict[str, str] = {}  # target key -> draft key, on the device
        self._pending: dict[str, str] = {}  # target key -> draft key, still loading

    def register(self, target_key: str, ref: object) -> str:
        """Tie the draft adapter `ref` (a local folder or an object-store reference) to the
        target adapter version `target_key`; returns its key. It drafts once loaded."""
        self.unregister(target_key)
        key, _ = self.runtime.resolve_adapter(ref)
        self._pending[target_key] = key
        self.key_for(target_key)  # loaded already (a local folder): active at once
        return key

    def unregister(self, target_key: str) -> None:
        """Untie the target adapter's draft adapter (its device rows may be reused)."""
        self._pending.pop(target_key, None)
        key = self._tied.pop(target_key, None)
        if key is not None:
            self.runtime.tiers.deactivate(key)

    def key_for(self, target_key: str | None) -> str | None:
        """The draft adapter key drafting for `target_key` now (None: none, or still loading)."""
        if target_key is None:
            return None
        key = self._tied.get(target_key)
        if key is not None:
            return key
        key = self._pending.get(target_key)
        if key is None:
            return None
        tiers = self.runtime.tiers
        rows = tiers.ready_rows(key)  # raises if its fetch failed
        if rows is None or not tiers.can_hold(key, rows):
            return None
        tiers.activate(key)
        del self._pending[target_key]
        self._tied[target_key] = key
        return key

    def meta(self, requests: list[Request], keys: list[str | None], counts: list[int]) -> object:
        """The LoRA metadata of a draft forward: row i runs `counts[i]` tokens with draft
        adapter `keys[i]` (rows of one key must be contiguous)."""
        views = [
            dataclasses.replace(r, adapter_key=k) if r.adapter_key != k else r
            for r, k in zip(requests, keys, strict=True)
        ]
        return self.runtime.prepare_step(views, counts)

"""Draft adapters (`method="draft_adapter"`): small LoRAs for the draft model, each tied to a
target adapter version, served by a multi-LoRA runtime of their own on the draft model.

A draft adapter is registered for a target adapter's version key and loaded like any adapter
(validated against the draft model's modules); once on the device it stays held while it is
registered, and the draft rows of that target adapter's requests run with it.
"""

from __future__ import annotations

import dataclasses
import logging

from torch import nn

from loraplex.platform.engine.lora import LoraRuntime
from loraplex.platform.engine.request import Request
from loraplex.platform.wire import AdapterRef, DraftAdapterRef

log = logging.getLogger(__name__)


class DraftAdapters:
    """Target adapter version key -> the draft adapter drafting for it."""

    def __init__(
        self,
        model: nn.Module,
        max_loras: int = 16,
        max_lora_rank: int = 64,
        object_store: object | None = None,
    ) -> None:
        self.runtime = LoraRuntime(
            model,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            object_store=object_store,  # type: ignore[arg-type]  # an ObjectReader
        )
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

    def tie(self, target_key: str, ref: DraftAdapterRef) -> str:
        """Tie the draft adapter a request's reference carries (from the gateway) to its target
        adapter version; a repeat of the tie in place does nothing. Returns its key."""
        key = ref.key
        if self._tied.get(target_key) == key or self._pending.get(target_key) == key:
            return key
        plain = AdapterRef(**ref.model_dump(exclude={"draft_model"}))
        return self.register(target_key, plain)

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
        try:
            rows = tiers.ready_rows(key)  # raises if its fetch failed
        except Exception as exc:  # noqa: BLE001 - the target's requests draft otherwise
            log.warning(
                "draft adapter %s for %s failed to load: %s", key[:12], target_key[:12], exc
            )
            del self._pending[target_key]
            return None
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

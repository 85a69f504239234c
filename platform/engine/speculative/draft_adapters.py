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
    """Target adapter version key -> the draft adapter drafting for it.

    A tie holds its draft adapter on the device only for the step that drafts with it
    (`key_for` holds, `end_step` lets go), as a target adapter is held only while its requests
    run: with more ties than the draft model's rows, the least recently used one gives its rows
    up to the next one needed, instead of the first ties keeping them for good."""

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
        self._tied: dict[str, str] = {}  # target key -> draft key
        self._held: set[str] = set()  # draft keys held on the device for this step

    def register(self, target_key: str, ref: object) -> str:
        """Tie the draft adapter `ref` (a local folder or an object-store reference) to the
        target adapter version `target_key`; returns its key. It drafts once loaded."""
        key, _ = self.runtime.resolve_adapter(ref)
        self._tied[target_key] = key
        self.runtime.tiers.ready_rows(key)  # starts its fetch now, if it has to be fetched
        return key

    def tie(self, target_key: str, ref: DraftAdapterRef) -> str:
        """Tie the draft adapter a request's reference carries (from the gateway) to its target
        adapter version; a repeat of the tie in place does nothing. Returns its key."""
        key = ref.key
        if self._tied.get(target_key) == key:
            return key
        plain = AdapterRef(**ref.model_dump(exclude={"draft_model"}))
        return self.register(target_key, plain)

    def unregister(self, target_key: str) -> None:
        """Untie the target adapter's draft adapter (its device rows go back to the pool once
        no step holds them)."""
        self._tied.pop(target_key, None)

    def key_for(self, target_key: str | None) -> str | None:
        """The draft adapter drafting for `target_key` this step, held on the device until
        `end_step` (None: no tie, still loading, or no rows free of this step's holds)."""
        if target_key is None:
            return None
        key = self._tied.get(target_key)
        if key is None or key in self._held:
            return key
        tiers = self.runtime.tiers
        try:
            rows = tiers.ready_rows(key)  # raises if its fetch failed
        except Exception as exc:  # noqa: BLE001 - the target's requests draft otherwise
            log.warning(
                "draft adapter %s for %s failed to load: %s", key[:12], target_key[:12], exc
            )
            del self._tied[target_key]
            return None
        if rows is None or not tiers.can_hold(key, rows):
            return None
        tiers.activate(key)
        self._held.add(key)
        return key

    def end_step(self) -> None:
        """Let go of this step's draft adapters: they stay resident until another needs the
        rows (least recently used first)."""
        for key in self._held:
            self.runtime.tiers.deactivate(key)
        self._held.clear()

    def meta(self, requests: list[Request], keys: list[str | None], counts: list[int]) -> object:
        """The LoRA metadata of a draft forward: row i runs `counts[i]` tokens with draft
        adapter `keys[i]` (rows of one key must be contiguous)."""
        views = [
            dataclasses.replace(r, adapter_key=k) if r.adapter_key != k else r
            for r, k in zip(requests, keys, strict=True)
        ]
        return self.runtime.prepare_step(views, counts)

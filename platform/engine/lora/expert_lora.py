"""Expert and router LoRA of the device-resident adapters, handed to the MoE blocks per step.

When the tiers copy an adapter to the device (`add`), its per-layer expert/router factors
(`adapters.expert_weights.ExpertLoraModule`, all experts) are cut to each block's local
expert slots and moved to the model's device and dtype; adapters the device pool evicted are
dropped at the next step (`retain`). Each MoE block asks `batch_for(block)` in its forward:
the step's token -> adapter slot map (from `ForwardContext.lora`) and each slot's weights for
that block, built once per step's metadata. Under expert parallelism each rank keeps only its
experts' slices on the device (the adapter's host copy holds them all), and an EPLB placement
change moves them with the experts. Expert LoRA bytes live beside the pool's rank rows, in a
budget of their own (`capacity_bytes`) that admission checks (`tiers.LoraTiers.can_hold`).
"""

from __future__ import annotations

import torch

from loraplex.adapters.expert_weights import ExpertLoraModule
from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.adapters.static_meta import StaticLoraView
from loraplex.adapters.weights import LoadedAdapter
from loraplex.moe.expert_lora import ExpertLoraBatch, ExpertLoraWeights
from loraplex.moe.layer import MoEBlock
from loraplex.moe.placement import ExpertPlacement
from loraplex.platform.engine.forward_context import peek_forward_context

_PER_EXPERT = ("w13_a", "w13_b", "w2_a", "w2_b")  # one row per expert (cut per rank)


def local_weights(
    module: ExpertLoraModule, experts: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> ExpertLoraWeights:
    """An adapter's layer factors for the block's local expert slots (one row per slot)."""
    idx = torch.tensor(experts, dtype=torch.long)

    def cut(t: torch.Tensor | None, per_expert: bool) -> torch.Tensor | None:
        if t is None:
            return None
        t = t.index_select(0, idx) if per_expert else t
        return t.to(device=device, dtype=dtype).contiguous()

    return ExpertLoraWeights(
        **{name: cut(t, name in _PER_EXPERT) for name, t in vars(module).items()}
    )


class ExpertLoraStore:
    """Per resident adapter, its expert/router LoRA for each MoE block (see module doc)."""

    def __init__(
        self,
        blocks: list[MoEBlock],
        dtype: torch.dtype,
        device: torch.device,
        capacity_bytes: int | None = None,
    ) -> None:
        self.blocks = blocks
        self.dtype = dtype
        self.device = device
        self.capacity_bytes = capacity_bytes if capacity_bytes is not None else 1 << 62
        self._weights: dict[str, dict[int, ExpertLoraWeights]] = {}
        self._modules: dict[str, dict[int, ExpertLoraModule]] = {}  # host, all experts
        self._meta: LoraBatchMeta | None = None
        self._batches: dict[int, ExpertLoraBatch | None] = {}
        for block in blocks:
            block.expert_lora = self.batch_for
            block.placement_listeners.append(self._moved)

    def detach(self) -> None:
        """The blocks stop asking for expert LoRA."""
        for block in self.blocks:
            block.expert_lora = None
            block.placement_listeners.remove(self._moved)

    def weights_for(self, key: str, layer: int) -> ExpertLoraWeights | None:
        """Adapter `key`'s factors for the block of `layer` (its local expert slots)."""
        return self._weights.get(key, {}).get(layer)

    def _moved(self, block: MoEBlock, _old: ExpertPlacement, _new: ExpertPlacement) -> None:
        """EPLB moved experts between ranks: every adapter's slices follow them. Each rank
        cuts its new experts' slices from the adapter's host copy (no collective: ranks of an
        engine may hold different adapters between two steps)."""
        for key, modules in self._modules.items():
            if block.layer_idx in modules:
                self._weights[key][block.layer_idx] = self._cut(modules[block.layer_idx], block)
        self._meta = None

    def add(self, adapter: LoadedAdapter) -> None:
        """An adapter was copied to the device: keep its expert factors for every block."""
        if not adapter.experts:
            return
        self._modules[adapter.key] = adapter.experts
        self._weights[adapter.key] = {
            block.layer_idx: self._cut(adapter.experts[block.layer_idx], block)
            for block in self.blocks
            if block.layer_idx in adapter.experts
        }
        self._meta = None

    def refresh(self, key: str) -> None:
        """Re-cut adapter `key`'s device factors from its host copy (rows laid in since)."""
        modules = self._modules.get(key, {})
        for block in self.blocks:
            if block.layer_idx in modules:
                self._weights[key][block.layer_idx] = self._cut(modules[block.layer_idx], block)
        self._meta = None

    def _cut(self, module: ExpertLoraModule, block: MoEBlock) -> ExpertLoraWeights:
        """An adapter's layer factors cut to `block`'s local expert slots, on the device."""
        return local_weights(module, block.local_experts, self.dtype, self.device)

    def retain(self, keys: list[str] | set[str]) -> None:
        """Drop the adapters no longer resident on the device."""
        keep = set(keys)
        for key in [k for k in self._weights if k not in keep]:
            del self._weights[key]
            del self._modules[key]
            self._meta = None

    @property
    def nbytes(self) -> int:
        """Device bytes the resident adapters' expert/router factors take (outside the pool)."""
        return sum(self.nbytes_of(key) for key in self._weights)

    def nbytes_of(self, key: str) -> int:
        """Device bytes adapter `key`'s factors take on this rank (0 when it holds none)."""
        return sum(
            t.numel() * t.element_size()
            for w in self._weights.get(key, {}).values()
            for t in vars(w).values()
            if isinstance(t, torch.Tensor)
        )

    def held_keys(self) -> list[str]:
        """The adapters whose factors are held."""
        return list(self._weights)

    def bytes_for(self, adapter: LoadedAdapter) -> int:
        """Device bytes `add(adapter)` would take on this rank: its factors of the experts
        this rank's blocks hold, in the store's dtype."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        total = 0
        for block in self.blocks:
            module = (adapter.experts or {}).get(block.layer_idx)
            if module is None:
                continue
            share = len(block.local_experts) / block.spec.num_experts
            for name, t in vars(module).items():
                if isinstance(t, torch.Tensor):
                    n = t.numel() * share if name in _PER_EXPERT else t.numel()
                    total += int(n) * elem
        return total

    def max_rank_bytes(self, rank: int) -> int:
        """What one adapter of `rank` on every expert target of every block takes on this rank
        (the default budget counts `max_loras` of these)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        total = 0
        for block in self.blocks:
            sp = block.spec
            h, i, s = sp.hidden_size, sp.intermediate_size, sp.shared_intermediate_size
            total += len(block.local_experts) * rank * (h + 2 * i + i + h)
            total += rank * (h + sp.num_experts)
            if s:
                total += rank * (h + 2 * s + s + h)
            if sp.shared_gated:
                total += rank * (h + 1)
        return total * elem

    def __contains__(self, key: str) -> bool:
        return key in self._weights

    def batch_for(self, block: MoEBlock) -> ExpertLoraBatch | None:
        """This step's expert LoRA for `block` (None when no scheduled adapter has any)."""
        ctx = peek_forward_context()
        meta = ctx.lora if ctx is not None else None
        if isinstance(meta, StaticLoraView):
            if self._weights:
                raise NotImplementedError(
                    "expert/router LoRA in captured decode graphs is not served: run the "
                    "engine eager (enforce_eager) to serve adapters on a MoE base's experts"
                )
            return None
        if not isinstance(meta, LoraBatchMeta) or not meta.groups:
            return None
        if meta is not self._meta:
            self._meta, self._batches = meta, {}
        if block.layer_idx not in self._batches:
            slots = [self._weights.get(g.key, {}).get(block.layer_idx) for g in meta.groups]
            batch = None
            if any(w is not None for w in slots):
                batch = ExpertLoraBatch(meta.token_slot.to(torch.long), slots)
            self._batches[block.layer_idx] = batch
        return self._batches[block.layer_idx]

"""Serving-time EPLB: count expert load per layer, periodically move to a balanced placement.

Works on any model exposing `moe_blocks()` (the engine's MoE decoders). A rebalance is
collective: every EP rank calls it at the same step boundary (the engine's step loop runs
in lockstep), computes the same placement from the all-reduced counts, and migrates
expert weights; requests in flight keep their KV cache and continue on the next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Gauge

from loraplex.moe.eplb import balancedness, rank_loads, rebalance
from loraplex.moe.placement import ExpertPlacement
from loraplex.moe.stats import ExpertLoadRecorder

if TYPE_CHECKING:
    from loraplex.moe.layer import MoEBlock


class BalancedModel(Protocol):
    """What the rebalancer needs of a model: its MoE blocks and a place for the recorder."""

    def moe_blocks(self) -> list[MoEBlock]:
        """The model's MoE blocks in layer order."""
        ...

    def attach_load_recorder(self, recorder: ExpertLoadRecorder | None) -> None:
        """Make every MoE block count its routed tokens into `recorder`."""
        ...


@dataclass(frozen=True)
class LayerRebalance:
    """What one layer's rebalance did: balancedness (mean/max per rank) before and after."""

    layer_idx: int
    before: float
    after: float
    placement: ExpertPlacement


class ExpertRebalancer:
    """Attach to an EP model: records load, rebalances every `interval_steps` (0 = manual)."""

    def __init__(
        self,
        model: BalancedModel,
        num_redundant: int = 0,
        interval_steps: int = 0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.blocks = list(model.moe_blocks())
        if not self.blocks:
            raise ValueError("the model has no MoE blocks to balance")
        first = self.blocks[0]
        if first.ep is None:
            raise ValueError("rebalancing needs an expert-parallel model (ep_size > 1)")
        self.ep = first.ep
        physical = first.spec.num_experts + num_redundant
        if num_redundant < 0 or physical % self.ep.world_size:
            raise ValueError(
                f"{first.spec.num_experts} experts + {num_redundant} redundant copies do not "
                f"split evenly over {self.ep.world_size} ranks"
            )
        self.num_redundant = num_redundant
        self.interval_steps = interval_steps
        self.steps = 0
        num_layers = max(b.layer_idx for b in self.blocks) + 1
        self.recorder = ExpertLoadRecorder(num_layers, first.spec.num_experts)
        model.attach_load_recorder(self.recorder)
        self.gauge = (
            Gauge(
                "loraplex:moe_balancedness",
                "Mean over max routed tokens per expert-parallel rank (1 = balanced).",
                ["layer"],
                registry=registry,
            )
            if registry is not None
            else None
        )

    def on_step(self) -> list[LayerRebalance] | None:
        """Call once per engine step on every rank; rebalances when the interval is reached."""
        self.steps += 1
        if self.interval_steps and self.steps % self.interval_steps == 0:
            return self.rebalance()
        return None

    def rebalance(self) -> list[LayerRebalance]:
        """Rebalance every MoE layer from the load counted since the last rebalance."""
        counts = self.recorder.global_counts(self.ep)
        done = []
        for block in self.blocks:
            load = counts[block.layer_idx]
            if int(load.sum()) == 0:
                continue
            assert block.placement is not None  # an expert-parallel block is placed
            before = balancedness(rank_loads(block.placement, load))
            new = rebalance(load, self.ep.world_size, self.num_redundant)
            block.apply_placement(new)
            after = balancedness(rank_loads(new, load))
            if self.gauge is not None:
                self.gauge.labels(layer=str(block.layer_idx)).set(after)
            done.append(LayerRebalance(block.layer_idx, before, after, new))
        self.recorder.reset()
        return done

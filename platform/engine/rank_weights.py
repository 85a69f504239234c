"""Which checkpoint tensors this process's model needs: under expert parallelism, only its
experts' (per-expert tensors by name, fused 3-D expert tensors by rows), so a rank never reads
another rank's experts. Derived from the built model's own placement, so it cannot disagree
with what `load_weights` expects."""

from __future__ import annotations

from torch import nn

from loraplex.loader.select import ExpertShare


def expert_share(model: nn.Module) -> ExpertShare | None:
    """The experts each MoE layer of `model` holds, or None when it holds every expert
    (a dense model, or a MoE model outside an expert-parallel group)."""
    blocks_of = getattr(model, "moe_blocks", None)
    blocks = blocks_of() if callable(blocks_of) else []
    if not blocks:
        return None
    share = ExpertShare(
        blocks[0].spec.num_experts,
        {b.layer_idx: frozenset(b.local_experts) for b in blocks},
    )
    return None if share.holds_all() else share

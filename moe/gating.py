"""Router gating: turn router logits into (weights, expert ids) per token.

Two families: softmax top-k (Mixtral, Qwen2/3-MoE), optionally renormalised over the
chosen k, or limited to the best expert groups (DeepSeek-V2's `group_limited_greedy`, a group
scored by its best expert); and DeepSeek-V3's sigmoid scoring, where a per-expert correction bias picks
the experts (grouped top-k) while the unbiased scores weight them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GatingConfig:
    """How a MoE block routes: scoring function, k, and the DeepSeek-V3 group knobs."""

    top_k: int
    scoring: str = "softmax"  # "softmax" | "sigmoid"
    renormalize: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"unknown MoE scoring function {self.scoring!r}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.n_group < 1 or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"need 1 <= topk_group <= n_group, got n_group={self.n_group}, "
                f"topk_group={self.topk_group}"
            )


def softmax_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts (in fp32), keep the k largest; weights [T, k] fp32, ids [T, k] int64."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def group_mask(
    scores: torch.Tensor, n_group: int, topk_group: int, per_group_k: int
) -> torch.Tensor:
    """[T, E] bool: the experts of each token's `topk_group` best groups, a group scored by the
    sum of its `per_group_k` best scores."""
    num_tokens, num_experts = scores.shape
    if num_experts % n_group:
        raise ValueError(f"{num_experts} experts do not split into {n_group} groups")
    per_group = num_experts // n_group
    grouped = scores.view(num_tokens, n_group, per_group)
    group_scores = grouped.topk(min(per_group_k, per_group), dim=-1).values.sum(dim=-1)
    best_groups = torch.topk(group_scores, topk_group, dim=-1).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool)
    mask.scatter_(1, best_groups, True)
    return mask.unsqueeze(-1).expand(-1, -1, per_group).reshape(num_tokens, num_experts)


def grouped_softmax_topk(
    logits: torch.Tensor, top_k: int, n_group: int, topk_group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's group-limited greedy: softmax scores, only the `topk_group` groups with
    the best single expert eligible; weights are the chosen experts' scores (no renormalising)."""
    probs = torch.softmax(logits.float(), dim=-1)
    eligible = group_mask(probs, n_group, topk_group, 1)
    ids = torch.topk(probs.masked_fill(~eligible, float("-inf")), top_k, dim=-1).indices
    return probs.gather(1, ids), ids


def grouped_topk(
    logits: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    routed_scaling_factor: float = 1.0,
    correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing: sigmoid scores; biased scores choose groups and experts.

    A group's score is the sum of its two best biased scores; only the `topk_group` best
    groups stay eligible. Weights come from the *unbiased* scores of the chosen experts,
    renormalised (optional) and multiplied by `routed_scaling_factor`.
    """
    scores = torch.sigmoid(logits.float())
    choice = scores if correction_bias is None else scores + correction_bias.float()
    expert_mask = group_mask(choice, n_group, topk_group, 2)
    masked = choice.masked_fill(~expert_mask, float("-inf"))
    ids = torch.topk(masked, top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


def select_experts(
    logits: torch.Tensor, cfg: GatingConfig, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route by `cfg`: returns (weights [T, k] fp32, expert ids [T, k] int64)."""
    if logits.dim() != 2:
        raise ValueError(f"router logits must be [tokens, experts], got {tuple(logits.shape)}")
    if cfg.top_k > logits.shape[1]:
        raise ValueError(f"top_k={cfg.top_k} exceeds the {logits.shape[1]} experts")
    if cfg.scoring == "softmax":
        if correction_bias is not None:
            raise ValueError("softmax gating takes no correction bias")
        if cfg.n_group != 1:
            if cfg.renormalize:
                raise ValueError("group-limited softmax gating does not renormalise")
            weights, ids = grouped_softmax_topk(logits, cfg.top_k, cfg.n_group, cfg.topk_group)
        else:
            weights, ids = softmax_topk(logits, cfg.top_k, cfg.renormalize)
        if cfg.routed_scaling_factor != 1.0:
            weights = weights * cfg.routed_scaling_factor
        return weights, ids
    return grouped_topk(
        logits,
        cfg.top_k,
        cfg.n_group,
        cfg.topk_group,
        cfg.renormalize,
        cfg.routed_scaling_factor,
        correction_bias,
    )

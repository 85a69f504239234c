"""Gating: softmax top-k (with/without renormalisation) and DeepSeek-V3 grouped top-k."""

from __future__ import annotations

import pytest
import torch

from loraplex.moe.gating import GatingConfig, grouped_topk, select_experts, softmax_topk


def test_softmax_topk_renormalises_only_when_asked() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w, ids = softmax_topk(logits, 2, renormalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(w, probs[:, :2])
    w_norm, _ = softmax_topk(logits, 2, renormalize=True)
    torch.testing.assert_close(w_norm.sum(-1), torch.ones(1))
    torch.testing.assert_close(w_norm, probs[:, :2] / probs[:, :2].sum())


def test_grouped_topk_bias_picks_but_scores_weigh() -> None:
    # 4 experts in 2 groups; the bias makes expert 3 win although its score is lowest.
    logits = torch.tensor([[1.0, 0.5, 0.0, -2.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    w, ids = grouped_topk(
        logits,
        top_k=1,
        n_group=2,
        topk_group=1,
        renormalize=False,
        routed_scaling_factor=2.0,
        correction_bias=bias,
    )
    assert ids.tolist() == [[3]]
    torch.testing.assert_close(w, torch.sigmoid(torch.tensor([[-2.0]])) * 2.0)


def test_grouped_topk_keeps_only_best_groups() -> None:
    # Group 0 = experts 0..3, group 1 = 4..7. Group 1 has the two best scores summed,
    # although the single best expert (0) lives in group 0.
    logits = torch.tensor([[3.0, -5.0, -5.0, -5.0, 2.5, 2.5, -5.0, -5.0]])
    _, ids = grouped_topk(logits, top_k=2, n_group=2, topk_group=1, renormalize=True)
    assert sorted(ids[0].tolist()) == [4, 5]
    _, ids_all = grouped_topk(logits, top_k=2, n_group=2, topk_group=2, renormalize=True)
    assert sorted(ids_all[0].tolist()) == [0, 4] or sorted(ids_all[0].tolist()) == [0, 5]


def test_select_experts_validates() -> None:
    with pytest.raises(ValueError, match="top_k"):
        select_experts(torch.zeros(2, 3), GatingConfig(top_k=4))
    with pytest.raises(ValueError, match="topk_group"):
        GatingConfig(top_k=2, scoring="sigmoid", n_group=2, topk_group=3)
    with pytest.raises(ValueError, match="scoring"):
        GatingConfig(top_k=1, scoring="relu")
    with pytest.raises(ValueError, match="groups"):
        grouped_topk(torch.zeros(1, 5), 1, 2, 1, True)

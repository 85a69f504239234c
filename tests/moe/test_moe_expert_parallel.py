"""Expert parallelism over gloo: 2 and 4 rank processes give the single-rank outputs.

A small stack of MoE blocks (softmax + gated shared expert, and DeepSeek-style grouped
sigmoid routing) runs a stream of batches, some smaller than the rank count. Midway every
rank counts load, computes an EPLB placement with redundant copies and migrates expert
weights; outputs before and after must equal the unsharded blocks.
"""

from __future__ import annotations

import pytest
import torch

from loraplex.moe.ep_launch import run_ep_group
from loraplex.moe.eplb import balancedness, rebalance
from loraplex.moe.gating import GatingConfig
from loraplex.moe.layer import MoEBlock
from loraplex.moe.placement import ExpertPlacement
from loraplex.moe.spec import MoESpec
from loraplex.moe.stats import ExpertLoadRecorder

HIDDEN, INTER, EXPERTS = 16, 8, 8
BATCH_SIZES = [5, 1, 3, 11, 2, 7]
REBALANCE_AFTER = 2


def _specs() -> list[MoESpec]:
    softmax = MoESpec(
        HIDDEN,
        INTER,
        EXPERTS,
        GatingConfig(top_k=2, renormalize=False),
        shared_intermediate_size=12,
        shared_gated=True,
    )
    grouped = MoESpec(
        HIDDEN,
        INTER,
        EXPERTS,
        GatingConfig(
            top_k=3, scoring="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=1.5
        ),
        shared_intermediate_size=8,
        correction_bias=True,
    )
    return [softmax, grouped, softmax]


def _checkpoint(layer: int, spec: MoESpec) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + layer)
    s = spec.shared_intermediate_size
    state = {"gate.weight": torch.randn(EXPERTS, HIDDEN, generator=g)}
    # Skew the router so a few experts are hot: rebalancing then has something to do.
    state["gate.weight"][0] += 1.5
    for e in range(EXPERTS):
        for name, shape in (
            ("gate_proj", (INTER, HIDDEN)),
            ("up_proj", (INTER, HIDDEN)),
            ("down_proj", (HIDDEN, INTER)),
        ):
            state[f"experts.{e}.{name}.weight"] = torch.randn(*shape, generator=g) * 0.3
    for name, shape in (
        ("gate_proj", (s, HIDDEN)),
        ("up_proj", (s, HIDDEN)),
        ("down_proj", (HIDDEN, s)),
    ):
        state[f"shared_expert.{name}.weight"] = torch.randn(*shape, generator=g) * 0.3
    if spec.shared_gated:
        state["shared_expert_gate.weight"] = torch.randn(1, HIDDEN, generator=g)
    if spec.correction_bias:
        state["gate.e_score_correction_bias"] = torch.randn(EXPERTS, generator=g) * 0.2
    return state


def _blocks(ep=None) -> list[MoEBlock]:
    blocks = []
    for layer, spec in enumerate(_specs()):
        block = MoEBlock(spec, layer_idx=layer, ep=ep)
        for name, tensor in _checkpoint(layer, spec).items():
            assert block.load_weight(name, tensor), name
        blocks.append(block)
    return blocks


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(n, HIDDEN, generator=g) for n in BATCH_SIZES]


def _run(blocks: list[MoEBlock], on_step=None) -> list[torch.Tensor]:
    outs = []
    with torch.no_grad():
        for step, x in enumerate(_batches()):
            h = x
            for block in blocks:
                h = h + block(h)
            outs.append(h)
            if on_step is not None:
                on_step(step)
    return outs


def _ep_worker(ep, rebalance_midway: bool):
    blocks = _blocks(ep)
    recorder = ExpertLoadRecorder(len(blocks), EXPERTS)
    for block in blocks:
        block.load_recorder = recorder
    info = {}

    def on_step(step: int) -> None:
        if not rebalance_midway or step != REBALANCE_AFTER:
            return
        counts = recorder.global_counts(ep)
        info["counts"] = counts.clone()
        info["before"] = [blocks[i].placement for i in range(len(blocks))]
        for layer, block in enumerate(blocks):
            block.apply_placement(rebalance(counts[layer], ep.world_size, ep.world_size))
        info["after"] = [b.placement for b in blocks]
        info["slots"] = [b.w13.shape[0] for b in blocks]
        recorder.reset()

    outs = _run(blocks, on_step)
    return outs, info


@pytest.fixture(scope="module")
def single_rank_outputs() -> list[torch.Tensor]:
    return _run(_blocks())


@pytest.mark.parametrize("world_size", [2, 4])
def test_expert_parallel_matches_single_rank_across_a_rebalance(world_size, single_rank_outputs):
    results = run_ep_group(world_size, _ep_worker, True, backend="gloo")
    for rank, (outs, info) in enumerate(results):
        for step, (got, want) in enumerate(zip(outs, single_rank_outputs, strict=True)):
            torch.testing.assert_close(
                got,
                want,
                atol=1e-4,
                rtol=1e-4,
                msg=lambda m, s=step, r=rank: f"rank {r} step {s}: {m}",
            )
        # Each rank held only its share of experts, then extra redundant copies.
        contiguous = ExpertPlacement.contiguous(EXPERTS, world_size)
        assert info["before"][0] == contiguous
        assert info["slots"] == [(EXPERTS + world_size) // world_size] * 3
        # The placement changed and every hot layer got replicas.
        assert any(len(set(a.replica_counts())) > 1 for a in info["after"])
    # Every rank computed the same placement from the all-reduced counts.
    assert len({tuple(r[1]["after"]) for r in results}) == 1
    counts = results[0][1]["counts"]
    assert int(counts.sum()) == sum(BATCH_SIZES[: REBALANCE_AFTER + 1]) * (2 + 3 + 2)
    for layer, placement in enumerate(results[0][1]["after"]):
        before = balancedness(
            _expected(ExpertPlacement.contiguous(EXPERTS, world_size), counts[layer])
        )
        after = balancedness(_expected(placement, counts[layer]))
        assert after >= before - 1e-9


def _expected(placement, load):
    from loraplex.moe.eplb import rank_loads

    return rank_loads(placement, load)

"""Expert and router LoRA under expert parallelism (2 gloo ranks): each rank holds only its
experts' adapter slices, rows travel with their token's adapter slot, and an EPLB rebalance
midway moves the slices with their experts; outputs before and after equal one rank's."""

from __future__ import annotations

import torch

from loraplex.adapters.expert_weights import ExpertLoraModule
from loraplex.adapters.targets import ResolvedTargets
from loraplex.adapters.weights import LoadedAdapter
from loraplex.moe.ep_launch import run_ep_group
from loraplex.moe.eplb import rebalance
from loraplex.moe.expert_lora import ExpertLoraBatch
from loraplex.moe.gating import GatingConfig
from loraplex.moe.layer import MoEBlock
from loraplex.moe.spec import MoESpec
from loraplex.moe.stats import ExpertLoadRecorder
from loraplex.platform.engine.lora.expert_lora import ExpertLoraStore, local_weights

HIDDEN, INTER, EXPERTS = 16, 8, 8
BATCH_SIZES = [5, 1, 7, 11, 3]
REBALANCE_AFTER = 1
KEYS = ["adapter-a", "adapter-b"]


def _specs() -> list[MoESpec]:
    softmax = MoESpec(HIDDEN, INTER, EXPERTS, GatingConfig(top_k=2, renormalize=False),
                      shared_intermediate_size=12, shared_gated=True)  # fmt: skip
    grouped = MoESpec(
        HIDDEN, INTER, EXPERTS,
        GatingConfig(top_k=3, scoring="sigmoid", n_group=4, topk_group=2,
                     routed_scaling_factor=1.5),
        shared_intermediate_size=8, correction_bias=True,
    )  # fmt: skip
    return [softmax, grouped]


def _blocks(ep=None) -> list[MoEBlock]:
    blocks = []
    for layer, spec in enumerate(_specs()):
        g = torch.Generator().manual_seed(100 + layer)
        block = MoEBlock(spec, layer_idx=layer, ep=ep)
        gate = torch.randn(EXPERTS, HIDDEN, generator=g)
        gate[0] += 1.5  # hot experts: the rebalance has work to do
        state = {
            "gate.weight": gate,
            "experts.gate_up_proj": torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g) * 0.3,
            "experts.down_proj": torch.randn(EXPERTS, HIDDEN, INTER, generator=g) * 0.3,
        }
        s = spec.shared_intermediate_size
        for name, shape in (("gate_proj", (s, HIDDEN)), ("up_proj", (s, HIDDEN)),
                            ("down_proj", (HIDDEN, s))):  # fmt: skip
            state[f"shared_expert.{name}.weight"] = torch.randn(*shape, generator=g) * 0.3
        if spec.shared_gated:
            state["shared_expert_gate.weight"] = torch.randn(1, HIDDEN, generator=g)
        if spec.correction_bias:
            state["gate.e_score_correction_bias"] = torch.randn(EXPERTS, generator=g) * 0.2
        for name, tensor in state.items():
            assert block.load_weight(name, tensor), name
        blocks.append(block)
    return blocks


def _adapter(i: int) -> LoadedAdapter:
    g = torch.Generator().manual_seed(50 + i)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    rank = 2 + i
    experts = {
        layer: ExpertLoraModule(
            w13_a=r(EXPERTS, rank, HIDDEN),
            w13_b=r(EXPERTS, 2 * INTER, rank),
            w2_a=r(EXPERTS, rank, INTER),
            w2_b=r(EXPERTS, HIDDEN, rank),
            router_a=r(rank, HIDDEN),
            router_b=r(EXPERTS, rank),
        )  # fmt: skip
        for layer in range(2)
    }
    return LoadedAdapter(KEYS[i], ResolvedTargets({}), {}, experts)


def _token_slots(n: int, step: int) -> torch.Tensor:
    return torch.randint(-1, 2, (n,), generator=torch.Generator().manual_seed(900 + step))


def _run(blocks, store: ExpertLoraStore, on_step=None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    outs = []
    with torch.no_grad():
        for step, n in enumerate(BATCH_SIZES):
            slots = _token_slots(n, step)
            for block in blocks:
                block.expert_lora = lambda b, s=slots: ExpertLoraBatch(
                    s, [store.weights_for(k, b.layer_idx) for k in KEYS]
                )
            h = torch.randn(n, HIDDEN, generator=g)
            for block in blocks:
                h = h + block(h)
            outs.append(h)
            if on_step is not None:
                on_step(step)
    return outs


def _store(blocks) -> ExpertLoraStore:
    store = ExpertLoraStore(blocks, torch.float32, torch.device("cpu"))
    for i in range(len(KEYS)):
        store.add(_adapter(i))
    return store


def _ep_worker(ep):
    blocks = _blocks(ep)
    store = _store(blocks)
    held = [w.w13_a.shape[0] for w in (store.weights_for(KEYS[0], b.layer_idx) for b in blocks)]
    recorder = ExpertLoadRecorder(len(blocks), EXPERTS)
    for block in blocks:
        block.load_recorder = recorder
    info = {"held_before": held}

    def on_step(step: int) -> None:
        if step != REBALANCE_AFTER:
            return
        counts = recorder.global_counts(ep)
        for layer, block in enumerate(blocks):
            block.apply_placement(rebalance(counts[layer], ep.world_size, ep.world_size))
        moved_ok = True
        for i, key in enumerate(KEYS):  # the slices moved are exactly the new experts' slices
            for block in blocks:
                got = store.weights_for(key, block.layer_idx)
                want = local_weights(
                    _adapter(i).experts[block.layer_idx], block.local_experts,
                    torch.float32, torch.device("cpu"),
                )  # fmt: skip
                moved_ok &= all(
                    torch.equal(getattr(got, n), getattr(want, n))
                    for n in ("w13_a", "w13_b", "w2_a", "w2_b")
                )
        info["moved_ok"] = moved_ok
        info["local_after"] = [b.local_experts for b in blocks]

    return _run(blocks, store, on_step), info


def test_expert_lora_under_ep2_matches_one_rank_across_a_rebalance():
    blocks = _blocks()
    want = _run(blocks, _store(blocks))
    base = _run(blocks, ExpertLoraStore(blocks, torch.float32, torch.device("cpu")))
    assert (want[0] - base[0]).abs().max() > 1e-2  # the adapters really change the output
    results = run_ep_group(2, _ep_worker, backend="gloo")
    for rank, (outs, info) in enumerate(results):
        assert info["held_before"] == [EXPERTS // 2, EXPERTS // 2]  # only its experts' slices
        assert info["moved_ok"]
        assert any(len(set(e)) < len(e) or len(e) != EXPERTS // 2 for e in info["local_after"])
        for step, (got, ref) in enumerate(zip(outs, want, strict=True)):
            torch.testing.assert_close(
                got, ref, atol=1e-5, rtol=1e-5, msg=lambda m, s=step, r=rank: f"rank {r} {s}: {m}"
            )

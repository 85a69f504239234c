"""Under expert parallelism each follower rank receives only its experts' slices of an adapter:
rank 0 reads the adapter whole (it checks the version's sha256) and sends every follower the
adapter without its per-expert factors plus the rows of the experts that rank holds; after an
EPLB rebalance, exactly the rows of the experts the rank newly holds follow. Outputs equal peft
before and after the rebalance."""

from __future__ import annotations

import os
import types

import pytest
import torch
from support.peft_logprobs import peft_logprobs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("peft")

PER_EXPERT = ("w13_a", "w13_b", "w2_a", "w2_b")


def _expert_row_bytes(adapter) -> dict[int, int]:
    """Per MoE layer, the bytes one expert's rows of the per-expert factors take."""
    out = {}
    for layer, module in adapter.experts.items():
        tensors = [getattr(module, n) for n in PER_EXPERT if getattr(module, n) is not None]
        out[layer] = sum(t[0].numel() * t.element_size() for t in tensors)
    return out


def test_followers_receive_only_their_experts_slices(tmp_path):
    from support.expert_adapters import expert_adapter, moe_base
    from support.logit_spy import record_sampled_logits

    from loraplex.moe.layer import MoEBlock
    from loraplex.platform.engine.ep_engine import start_ep_engine
    from loraplex.platform.engine.lora.runtime import LoraRuntime
    from loraplex.platform.engine.sampling_params import SamplingParams
    from loraplex.platform.engine_spec.config import EngineConfig

    hf = moe_base("qwen3_moe")
    hf.save_pretrained(str(tmp_path / "base"))
    fused = expert_adapter(hf, tmp_path / "fused", seed=11)
    config = EngineConfig(
        model=str(tmp_path / "base"), max_num_seqs=4, max_num_batched_tokens=16,
        max_model_len=64, block_size=4, num_gpu_blocks=64, max_loras=2, max_lora_rank=8,
    )  # fmt: skip
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (11, 5)]
    refs = [fused, None]
    engine = start_ep_engine(config, 2, num_redundant=2, backend="gloo")
    try:
        runtime = LoraRuntime.for_engine(engine.core)
        engine.install_lora_runtime(runtime)
        mirror = engine.lora_box[0]
        blocks = [m for m in engine.core.model.modules() if isinstance(m, MoEBlock)]
        rows = record_sampled_logits(types.SimpleNamespace(core=engine.core))
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        reqs = [
            engine.add_request(p, params, adapter=str(r) if r else None)
            for p, r in zip(prompts, refs, strict=True)
        ]
        engine.step()
        adapter = runtime.host.get(reqs[0].adapter_key)
        per_expert = _expert_row_bytes(adapter)
        held = {b.layer_idx: set(b.placement.local_experts(1)) for b in blocks}
        assert all(len(h) == 4 for h in held.values())  # 4 of the 8 experts per layer
        first = sum(per_expert[layer] * len(h) for layer, h in held.items())
        assert mirror.sent_expert_bytes[1] == first  # half the experts' rows, nothing more
        total = sum(x.nbytes for x in adapter.experts.values())
        assert first < 0.6 * total
        steps = 1
        while engine.has_unfinished():
            engine.step()
            steps += 1
            if steps == 3:  # mid-generation: experts move, and their adapter rows follow
                engine.rebalance()
                new = {b.layer_idx: set(b.placement.local_experts(1)) for b in blocks}
        assert engine.last_rebalance
    finally:
        engine.close()
    moved = sum(per_expert[layer] * len(new[layer] - held[layer]) for layer in new)
    assert moved > 0
    assert mirror.sent_expert_bytes[1] == first + moved
    for prompt, ref, req in zip(prompts, refs, reqs, strict=True):
        seq = prompt + list(req.output_token_ids)
        want = peft_logprobs(hf, ref, seq[:-1])[len(prompt) - 1 :]
        got = torch.log_softmax(torch.stack(rows[req.request_id]), dim=-1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

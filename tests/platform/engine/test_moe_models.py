"""Tiny random Mixtral, Qwen2-MoE and Qwen3-MoE: engine logits equal transformers (fp32, 1e-4)
in mixed prefill/decode batches through the paged KV cache, from both checkpoint layouts."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from support.paged_harness import PagedHarness, run_mixed_scenario

from loraplex.bench._synthetic.models import hf_config, random_model
from loraplex.moe.layer import MoEBlock
from loraplex.moe.stats import ExpertLoadRecorder
from loraplex.platform.engine.model_loading import load_model
from loraplex.platform.engine.models.weight_loading import WeightLoadingError

transformers = pytest.importorskip("transformers")


def _config(arch: str):
    if arch == "mixtral":
        return hf_config(
            "mixtral", intermediate_size=80, num_local_experts=6, num_experts_per_tok=2
        )
    if arch == "qwen2_moe":
        # layer 1 dense (mlp_only_layers) to cover interleaved dense/sparse layers
        return hf_config(
            "qwen2_moe", intermediate_size=80, num_hidden_layers=3, num_experts=8,
            num_experts_per_tok=3, moe_intermediate_size=24, shared_expert_intermediate_size=48,
            mlp_only_layers=[1], norm_topk_prob=False,
        )  # fmt: skip
    if arch == "qwen3_moe":
        return hf_config(
            "qwen3_moe", intermediate_size=80, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, norm_topk_prob=True,
        )  # fmt: skip
    raise ValueError(arch)


def _save(tmp_path, arch: str, layout: str):
    hf = random_model(_config(arch), seed=3)
    hf.save_pretrained(str(tmp_path))  # transformers writes the legacy per-expert names
    if layout == "fused":
        _write_state(tmp_path, {k: v.contiguous() for k, v in hf.state_dict().items()})
    return hf


def _write_state(path, state: dict[str, torch.Tensor]) -> None:
    """Replace the checkpoint with transformers' in-memory (fused 3-D expert) tensors."""
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    files = list(path.glob("*.safetensors"))
    assert len(files) == 1
    save_file(state, str(files[0]))


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_model_mixed_batches_match_transformers(tmp_path, arch, layout):
    hf = _save(tmp_path, arch, layout)
    model = load_model(tmp_path, dtype="float32")
    blocks = [m for m in model.modules() if isinstance(m, MoEBlock)]
    assert len(blocks) == (2 if arch == "qwen2_moe" else model.config.num_hidden_layers)
    run_mixed_scenario(model, hf, atol=1e-4)


def test_moe_model_missing_expert_is_an_error(tmp_path):
    hf = _save(tmp_path, "qwen3_moe", "per_expert")
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    del state["model.layers.1.mlp.experts.down_proj"]
    _write_state(tmp_path, state)
    with pytest.raises(WeightLoadingError, match="layers.1.mlp.w2"):
        load_model(tmp_path, dtype="float32")


def test_moe_model_load_recorder_counts_routed_pairs(tmp_path):
    _save(tmp_path, "mixtral", "fused")
    model = load_model(tmp_path, dtype="float32")
    recorder = ExpertLoadRecorder(model.config.num_hidden_layers, 6)
    model.attach_load_recorder(recorder)
    PagedHarness(model).step([("a", [1, 2, 3, 4, 5]), ("b", [6, 7])])
    assert recorder.counts.sum(dim=1).tolist() == [7 * 2, 7 * 2]
    assert torch.all(recorder.counts >= 0)

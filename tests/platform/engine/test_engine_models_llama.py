"""Llama through the paged KV cache equals transformers' logits (fp32, 1e-4)."""

from __future__ import annotations

import pytest
import torch
from support.paged_harness import PagedHarness, check_against_hf, run_mixed_scenario

from loraplex.bench._synthetic.models import save_tiny_model
from loraplex.platform.engine.layers.rotary import compute_inv_freq
from loraplex.platform.engine.model_loading import load_model

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 10000.0,
}


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"tie": True},
        {"rope_scaling": LLAMA3_ROPE},
        {"num_key_value_heads": 1, "max_shard_size": "40KB"},
        {"attention_bias": True, "mlp_bias": True},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    ],
    ids=["untied", "tied", "llama3-rope", "mqa-sharded", "biases", "linear-rope"],
)
def test_llama_mixed_batches_match_transformers(tmp_path, opts):
    hf = save_tiny_model(tmp_path, "llama", **opts)
    if "max_shard_size" in opts:
        assert (tmp_path / "model.safetensors.index.json").is_file()
    run_mixed_scenario(load_model(tmp_path, dtype="float32"), hf)


def test_llama_single_prompt_prefill(tmp_path):
    hf = save_tiny_model(tmp_path, "llama")
    h = PagedHarness(load_model(tmp_path, dtype="float32"), block_size=8)
    (logits,) = h.step([("a", list(range(3, 40)))])
    check_against_hf(h, hf, "a", logits, 1e-4)


def test_llama3_rope_scaling_changes_frequencies():
    base = compute_inv_freq(16, {"rope_theta": 10000.0})
    scaled = compute_inv_freq(16, {**LLAMA3_ROPE})
    assert scaled[0] == base[0]  # short wavelengths untouched
    assert scaled[-1] == pytest.approx(base[-1] / 8.0)  # long wavelengths slowed by `factor`


@pytest.mark.parametrize("rope_type", ["dynamic", "yarn"])
def test_unsupported_rope_raises(tmp_path, rope_type):
    save_tiny_model(tmp_path, "llama", with_tokenizer=False)
    import json

    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(NotImplementedError, match=rope_type):
        load_model(tmp_path, dtype="float32")


def test_llama_greedy_batch_equals_transformers_generate(tmp_path):
    """Prompts of different lengths decoded together give HF generate's greedy tokens."""
    hf = save_tiny_model(tmp_path, "llama")
    h = PagedHarness(load_model(tmp_path, dtype="float32"), block_size=4)
    prompts = {"a": [5, 9, 33, 2, 71], "b": list(range(10, 31)), "c": [100]}
    new_tokens = 8
    out = h.step(list(prompts.items()))
    generated = {s: [int(lg[-1].argmax())] for s, lg in zip(prompts, out, strict=True)}
    for _ in range(new_tokens - 1):
        out = h.step([(s, [generated[s][-1]]) for s in prompts])
        for s, lg in zip(prompts, out, strict=True):
            generated[s].append(int(lg[-1].argmax()))
    for s, prompt in prompts.items():
        ref = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert generated[s] == ref, s

"""Qwen2 (q/k/v bias) and Qwen3 (q/k norm) through the paged KV cache equal transformers."""

from __future__ import annotations

import pytest
from support.paged_harness import run_mixed_scenario

from loraplex.bench._synthetic.models import save_tiny_model
from loraplex.platform.engine.model_loading import load_model


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_qwen2_mixed_batches_match_transformers(tmp_path, tie):
    hf = save_tiny_model(tmp_path, "qwen2", tie=tie)
    model = load_model(tmp_path, dtype="float32")
    assert model.model.layers[0].self_attn.qkv_proj.bias is not None
    assert model.model.layers[0].self_attn.o_proj.bias is None
    run_mixed_scenario(model, hf)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_qwen3_mixed_batches_match_transformers(tmp_path, tie):
    hf = save_tiny_model(tmp_path, "qwen3", tie=tie)
    model = load_model(tmp_path, dtype="float32")
    assert model.model.layers[0].self_attn.q_norm is not None
    run_mixed_scenario(model, hf)


def test_qwen2_sliding_window_is_refused(tmp_path):
    save_tiny_model(
        tmp_path, "qwen2", with_tokenizer=False, use_sliding_window=True, sliding_window=8
    )
    with pytest.raises(NotImplementedError, match="sliding"):
        load_model(tmp_path, dtype="float32")

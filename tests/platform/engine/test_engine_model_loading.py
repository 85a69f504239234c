"""Model folder reading, the architecture registry, weight-loading errors, KV cache sizing,
the tokenizer helpers and the Linear LoRA seam."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.paged_harness import PagedHarness

from loraplex.bench._synthetic.models import save_tiny_model
from loraplex.platform.engine.hf_folder import ModelFolderError, iter_weights, read_config
from loraplex.platform.engine.kv_cache import (
    allocate_kv_cache,
    attention_layers,
    kv_cache_bytes_per_block,
    num_blocks_for_budget,
)
from loraplex.platform.engine.layers.linear import Linear
from loraplex.platform.engine.model_loading import load_model
from loraplex.platform.engine.models import (
    UnsupportedArchitectureError,
    resolve_model_class,
    supported_architectures,
)
from loraplex.platform.engine.models.weight_loading import WeightLoadingError
from loraplex.platform.tokenizing import TokenizerNotFound, load_tokenizer


@pytest.fixture()
def llama_dir(tmp_path):
    save_tiny_model(tmp_path, "llama")
    return tmp_path


def test_registry_resolves_and_rejects():
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"} <= set(
        supported_architectures()
    )
    assert resolve_model_class({"architectures": ["Qwen3ForCausalLM"]}).__name__ == (
        "Qwen3ForCausalLM"
    )
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        resolve_model_class({"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(UnsupportedArchitectureError, match="none given"):
        resolve_model_class({})


def test_folder_errors(tmp_path):
    with pytest.raises(ModelFolderError, match="not a local directory"):
        read_config(tmp_path / "absent")
    with pytest.raises(ModelFolderError, match="no config.json"):
        read_config(tmp_path)
    with pytest.raises(ModelFolderError, match="no \\*.safetensors"):
        list(iter_weights(tmp_path))


def _rewrite_weights(folder, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor_is_an_error(llama_dir):
    _rewrite_weights(llama_dir, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(WeightLoadingError, match=r"qkv_proj.weight\[k_proj\]"):
        load_model(llama_dir, dtype="float32")


def test_unknown_tensor_is_an_error(llama_dir):
    _rewrite_weights(llama_dir, lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    with pytest.raises(WeightLoadingError, match="model.extra.weight"):
        load_model(llama_dir, dtype="float32")


def test_misshaped_tensor_is_an_error(llama_dir):
    def edit(t):
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:-1]

    _rewrite_weights(llama_dir, edit)
    with pytest.raises(WeightLoadingError, match="up_proj"):
        load_model(llama_dir, dtype="float32")


def test_kv_cache_sizing_and_binding(llama_dir):
    model = load_model(llama_dir, dtype="float32")
    cfg = read_config(llama_dir)
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    per_block = 2 * 16 * cfg["num_key_value_heads"] * head_dim * 2 * cfg["num_hidden_layers"]
    assert kv_cache_bytes_per_block(model, 16, torch.bfloat16) == per_block
    assert num_blocks_for_budget(model, per_block * 10 + 1, 16, torch.bfloat16) == 10
    caches = allocate_kv_cache(model, 10, 16, torch.bfloat16, "cpu")
    layers = attention_layers(model)
    assert [a.kv_cache is c for a, c in zip(layers, caches, strict=True)] == [True] * len(layers)
    assert caches[0].shape == (2, 10, 16, cfg["num_key_value_heads"], head_dim)


def test_bf16_model_runs_close_to_fp32(llama_dir):
    prompt = list(range(4, 30))
    outs = []
    for dtype in ("float32", "bfloat16"):
        model = load_model(llama_dir, dtype=dtype)
        assert model.lm_head.weight.dtype == getattr(torch, dtype)
        h = PagedHarness(model, dtype=getattr(torch, dtype))
        (logits,) = h.step([("a", prompt)])
        assert logits.dtype == torch.float32
        outs.append(logits)
    assert (outs[0] - outs[1]).abs().max() < 0.25 * outs[0].abs().max()


def test_tokenizer_helpers(llama_dir):
    tok = load_tokenizer(llama_dir)
    ids = tok.encode("hello world")
    assert tok.decode(ids) == "hello world"
    assert tok.bos_token == "<s>" and tok.bos_token_id == 1
    assert 2 in tok.eos_token_ids
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<s>user: hi\n<s>assistant: "


def test_tokenizer_missing(tmp_path):
    with pytest.raises(TokenizerNotFound, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_linear_seam_calls_lora_delta(llama_dir):
    model = load_model(llama_dir, dtype="float32")
    qkv = model.model.layers[1].self_attn.qkv_proj
    assert isinstance(qkv, Linear)
    assert qkv.layer_idx == 1 and qkv.slice_names == ["q_proj", "k_proj", "v_proj"]
    assert sum(qkv.slice_sizes) == qkv.out_features
    x = torch.randn(3, qkv.in_features)
    base = qkv(x)
    seen = {}

    def delta(inp, y, module):
        seen["module"] = module
        off, size = module.slice_offsets[1], module.slice_sizes[1]
        y[:, off : off + size] += 1.0

    qkv.lora_delta = delta
    out = qkv(x)
    assert seen["module"] is qkv
    off, size = qkv.slice_offsets[1], qkv.slice_sizes[1]
    torch.testing.assert_close(out[:, off : off + size], base[:, off : off + size] + 1.0)
    torch.testing.assert_close(out[:, :off], base[:, :off])


def test_config_without_architectures_is_refused(llama_dir):
    cfg = json.loads((llama_dir / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (llama_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="MambaForCausalLM"):
        load_model(llama_dir)

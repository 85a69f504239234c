"""The demo model is a real Llama checkpoint: transformers loads it with every weight
accounted for and runs it; its tokenizer round-trips text; same seed, same bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from loraplex.platform.demo_model import make_demo_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("demo"))


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_transformers_loads_every_weight_and_runs(demo_dir: Path) -> None:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        demo_dir, output_loading_info=True
    )
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    config = json.loads((demo_dir / "config.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(demo_dir)
    assert len(tok) == config["vocab_size"]
    ids = tok("The library opens at nine.", return_tensors="pt").input_ids
    assert ids[0, 0].item() == config["bos_token_id"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config["vocab_size"])
    assert torch.isfinite(logits).all()
    # Random init with std 0.02 like HF: small, non-degenerate weights.
    q = model.model.layers[0].self_attn.q_proj.weight
    assert 0.015 < q.std().item() < 0.025
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_tokenizer_round_trips_and_has_chat_template(demo_dir: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(demo_dir)
    for text in ["Hello! How are you today?", "  spaces,\ttabs\nand ünïcödé 123 ✓", ""]:
        ids = tok(text).input_ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<s><|user|>\nhi</s>\n<|assistant|>\n"


def test_same_seed_same_files_other_seed_other_weights(demo_dir: Path, tmp_path: Path) -> None:
    again = _digest(make_demo_model(tmp_path / "again", seed=0))
    assert again == _digest(demo_dir)
    other = _digest(make_demo_model(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    assert other["tokenizer.json"] == again["tokenizer.json"]

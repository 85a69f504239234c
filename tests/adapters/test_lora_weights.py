"""Adapter loading: PEFT files -> per-module A, B, scale, validated against the base dims."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.peft_adapters import make_adapter

from loraplex.adapters.peft_format import AdapterFormatError
from loraplex.adapters.weights import (
    adapter_version_key,
    load_adapter,
    load_adapter_dir,
    read_adapter_dir,
)
from loraplex.bench._synthetic.models import TINY, hf_config, random_model

HF = dict(TINY)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    base = random_model(hf_config("llama"), init="hf")
    return make_adapter(
        base,
        tmp_path_factory.mktemp("ad"),
        seed=3,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "down_proj"],
        rank_pattern={"down_proj": 4},
    )


def test_loads_every_module_with_its_rank_and_scale(adapter_dir):
    ad = load_adapter_dir(adapter_dir, HF)
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert set(ad.modules) == {(i, m) for i in range(2) for m in ("q_proj", "down_proj")}
    q = ad.modules[(1, "q_proj")]
    assert q.rank == 8 and q.scale == 2.0
    torch.testing.assert_close(
        q.a, tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"]
    )
    d = ad.modules[(0, "down_proj")]
    assert d.rank == 4 and d.scale == 4.0 and d.a.shape == (4, 96) and d.b.shape == (64, 4)
    assert ad.max_rank == 8
    cfg, w = read_adapter_dir(adapter_dir)
    assert ad.key == adapter_version_key(cfg, w) and len(ad.key) == 64
    assert ad.nbytes == sum(t.numel() * 4 for t in tensors.values())


def _mutate(adapter_dir, tmp_path, fn, cfg_fn=None):
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    fn(tensors)
    if cfg_fn:
        cfg_fn(cfg)
    out = tmp_path / "weights.safetensors"
    save_file(tensors, str(out))
    return json.dumps(cfg).encode(), out.read_bytes()


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    "fn, needle",
    [
        (lambda t: t.__setitem__(f"{Q0}.lora_A.weight", torch.zeros(8, 63)), "shape"),
        (
            lambda t: t.__setitem__(f"{Q0}.lora_B.weight", torch.zeros(64, 8, dtype=torch.int32)),
            "dtype",
        ),
        (lambda t: t.__setitem__(f"{Q0}.lora_A.weight", torch.full((8, 64), float("nan"))), "NaN"),
        (lambda t: t.pop(f"{Q0}.lora_B.weight"), "lora_B is missing"),
        (lambda t: [t.pop(f"{Q0}.lora_A.weight"), t.pop(f"{Q0}.lora_B.weight")], "targeted but"),
        (
            lambda t: t.__setitem__(
                "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", torch.zeros(8, 64)
            ),
            "excludes it",
        ),
        (
            lambda t: t.__setitem__(
                "base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight", torch.zeros(8, 64)
            ),
            "2 layers",
        ),
        (
            lambda t: t.__setitem__("base_model.model.lm_head.lora_A.weight", torch.zeros(8, 64)),
            "unexpected",
        ),
        (
            lambda t: t.__setitem__(f"{Q0}.lora_A.default.weight", torch.zeros(8, 64)),
            "a second lora_A",
        ),
    ],
)
def test_bad_tensors_are_refused(adapter_dir, tmp_path, fn, needle):
    cfg, w = _mutate(adapter_dir, tmp_path, fn)
    with pytest.raises(AdapterFormatError, match=needle):
        load_adapter(cfg, w, HF)


def test_rank_limit_and_garbage_files(adapter_dir, tmp_path):
    cfg, w = read_adapter_dir(adapter_dir)
    with pytest.raises(AdapterFormatError, match="max_lora_rank"):
        load_adapter(cfg, w, HF, max_rank=4)
    with pytest.raises(AdapterFormatError, match="safetensors"):
        load_adapter(cfg, b"\x00" * 16, HF)
    with pytest.raises(AdapterFormatError, match="shape"):
        load_adapter(cfg, w, HF | {"hidden_size": 128, "num_attention_heads": 4})


def test_directory_rules(adapter_dir, tmp_path):
    with pytest.raises(AdapterFormatError, match="does not exist"):
        read_adapter_dir(tmp_path / "nope")
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "adapter_config.json").write_bytes((adapter_dir / "adapter_config.json").read_bytes())
    (d / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(AdapterFormatError, match="pickle"):
        read_adapter_dir(d)
    with pytest.raises(AdapterFormatError, match="over the limit"):
        read_adapter_dir(adapter_dir, max_bytes=10)


def test_version_key_tracks_both_files(adapter_dir, tmp_path):
    cfg, w = read_adapter_dir(adapter_dir)
    k = adapter_version_key(cfg, w)
    assert adapter_version_key(cfg.replace(b"16", b"17"), w) != k
    assert adapter_version_key(cfg, w[:-1] + bytes([w[-1] ^ 1])) != k
    assert adapter_version_key(cfg + w[:1], w[1:]) != k  # length-prefixed: no boundary games

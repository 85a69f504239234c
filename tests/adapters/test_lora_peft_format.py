"""PEFT adapter format: config parsing, tensor names, dims, and rank/scale resolution vs peft."""

from __future__ import annotations

import json
import math

import pytest
from support.peft_adapters import make_adapter

from loraplex.adapters.peft_format import (
    LORA_MODULES,
    AdapterFormatError,
    module_dims,
    parse_adapter_config,
    parse_lora_tensor_name,
)
from loraplex.adapters.targets import ResolvedTargets, resolve_targets
from loraplex.bench._synthetic.models import TINY, hf_config, random_model

BASE = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}


def test_parse_minimal_bytes_and_dict():
    cfg = parse_adapter_config(json.dumps(BASE).encode())
    assert cfg.r == 8 and cfg.lora_alpha == 16.0 and not cfg.use_rslora
    assert cfg.target_modules == ["q_proj", "v_proj"]
    assert parse_adapter_config(BASE) == cfg


@pytest.mark.parametrize(
    "raw, needle",
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe", "UTF-8"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"lora_alpha": 8, "target_modules": ["q_proj"]}).encode(), "missing 'r'"),
        (json.dumps({"r": 0, "lora_alpha": 8, "target_modules": ["q_proj"]}).encode(), "r must"),
        (json.dumps({"r": 8.5, "lora_alpha": 8, "target_modules": ["q_proj"]}).encode(), "r must"),
        (json.dumps({"r": True, "lora_alpha": 8, "target_modules": ["q_proj"]}).encode(), "r must"),
        (json.dumps({"r": 8, "target_modules": ["q_proj"]}).encode(), "missing 'lora_alpha'"),
        (json.dumps({"r": 8, "lora_alpha": "x", "target_modules": ["q"]}).encode(), "lora_alpha"),
        (json.dumps({"r": 8, "lora_alpha": -1, "target_modules": ["q"]}).encode(), "lora_alpha"),
        (json.dumps(BASE | {"use_dora": True}).encode(), "not supported yet"),
        (json.dumps(BASE | {"modules_to_save": ["lm_head"]}).encode(), "not supported yet"),
        (json.dumps(BASE | {"peft_type": "IA3"}).encode(), "only LORA"),
        (json.dumps(BASE | {"target_modules": "("}).encode(), "regular expression"),
        (json.dumps(BASE | {"target_modules": []}).encode(), "targets no module"),
        (json.dumps(BASE | {"rank_pattern": {"q_proj": 0}}).encode(), "rank_pattern"),
        (json.dumps(BASE | {"alpha_pattern": []}).encode(), "alpha_pattern"),
        (b"[" * 100000 + b"]" * 100000, "JSON"),
    ],
)
def test_bad_configs_are_refused(raw, needle):
    with pytest.raises(AdapterFormatError, match=needle):
        parse_adapter_config(raw)


def test_dora_message_is_clear():
    with pytest.raises(AdapterFormatError) as exc:
        parse_adapter_config(BASE | {"use_dora": True})
    assert "DoRA" in str(exc.value)


@pytest.mark.parametrize(
    "name, layer, module, kind",
    [
        ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight", 3, "q_proj", "A"),
        ("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight", 0, "down_proj", "B"),
        (
            "base_model.model.model.layers.12.mlp.gate_proj.lora_A.default.weight",
            12,
            "gate_proj",
            "A",
        ),
        (
            "base_model.model.model.layers.1.self_attn.o_proj.lora_B.my-ad_1.weight",
            1,
            "o_proj",
            "B",
        ),
    ],
)
def test_tensor_names(name, layer, module, kind):
    t = parse_lora_tensor_name(name)
    assert (t.layer_idx, t.module, t.kind) == (layer, module, kind)
    block = "self_attn" if module in {"q_proj", "k_proj", "v_proj", "o_proj"} else "mlp"
    assert t.module_path == f"model.layers.{layer}.{block}.{module}"


@pytest.mark.parametrize(
    "name",
    [
        "base_model.model.model.layers.3.mlp.q_proj.lora_A.weight",
        "base_model.model.model.layers.3.self_attn.gate_proj.lora_A.weight",
        "base_model.model.lm_head.lora_A.weight",
        "base_model.model.model.layers.3.self_attn.q_proj.lora_C.weight",
        "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight.x",
        "base_model.model.model.layers.03.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight",
        "model.layers.3.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "",
    ],
)
def test_bad_tensor_names(name):
    with pytest.raises(AdapterFormatError):
        parse_lora_tensor_name(name)


def test_module_dims_dense_and_moe():
    cfg = dict(TINY)
    dims = module_dims(cfg)
    assert dims["q_proj"] == (64, 64) and dims["k_proj"] == (64, 32) and dims["v_proj"] == (64, 32)
    assert dims["o_proj"] == (64, 64)
    assert dims["gate_proj"] == (64, 96) and dims["up_proj"] == (64, 96)
    assert dims["down_proj"] == (96, 64)
    moe = cfg | {"num_local_experts": 4, "head_dim": 32}
    dims = module_dims(moe)
    assert set(dims) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert dims["q_proj"] == (64, 128) and dims["o_proj"] == (128, 64)


def _resolved(cfg_dict: dict):
    return resolve_targets(parse_adapter_config(cfg_dict), TINY)


def test_rslora_and_patterns():
    t = _resolved(
        {
            "r": 16,
            "lora_alpha": 32,
            "use_rslora": True,
            "target_modules": "all-linear",
            "rank_pattern": {"q_proj": 4, r"layers\.1\.mlp\.down_proj": 64},
            "alpha_pattern": {"v_proj": 8},
        }
    )
    assert t.get(0, "q_proj").rank == 4
    assert t.get(1, "down_proj").rank == 64
    assert t.get(0, "down_proj").rank == 16
    assert t.get(0, "v_proj").scale == pytest.approx(8 / 4)
    assert t.get(0, "q_proj").scale == pytest.approx(32 / 2)
    assert t.get(0, "gate_proj") is not None and t.get(0, "up_proj") is not None
    only1 = _resolved(
        {"r": 4, "lora_alpha": 4, "target_modules": "all-linear", "layers_to_transform": 1}
    )
    assert only1.get(1, "up_proj") is not None and only1.get(0, "up_proj") is None
    assert ResolvedTargets.from_json(only1.to_json()) == only1


CASES = [
    dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    dict(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=True),
    dict(
        r=16,
        lora_alpha=32,
        target_modules=r".*\.(q_proj|down_proj|up_proj)",
        rank_pattern={"down_proj": 4, r"layers\.1\.self_attn\.q_proj": 12},
        alpha_pattern={"up_proj": 5},
    ),
    dict(r=8, lora_alpha=8, target_modules=["o_proj", "gate_proj"], layers_to_transform=[1]),
    dict(
        r=6,
        lora_alpha=10,
        target_modules=["k_proj", "up_proj", "q_proj"],
        use_rslora=True,
        rank_pattern={"k_proj": 2},
        exclude_modules=[r"layers.0.self_attn.q_proj"],
    ),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_targets_rank_scale_agree_with_peft(tmp_path, case):
    """Our config resolution must give the same module set, ranks and scales as peft itself."""
    from peft import PeftModel

    base = random_model(hf_config("llama"), init="hf")
    path = make_adapter(base, tmp_path / "ad", seed=case, **CASES[case])
    cfg = parse_adapter_config((path / "adapter_config.json").read_bytes())
    targets = resolve_targets(cfg, TINY)
    peft_model = PeftModel.from_pretrained(random_model(hf_config("llama"), init="hf"), path)
    inner = peft_model.base_model.model
    for layer in range(TINY["num_hidden_layers"]):
        for m in LORA_MODULES:
            block = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            mp = f"model.layers.{layer}.{block}.{m}"
            mod = inner.get_submodule(mp)
            has = hasattr(mod, "lora_A") and "default" in mod.lora_A
            got = targets.get(layer, m)
            assert (got is not None) == has, mp
            if has:
                assert got.rank == mod.r["default"], mp
                assert math.isclose(got.scale, mod.scaling["default"], rel_tol=1e-9), mp

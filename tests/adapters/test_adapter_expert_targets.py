"""LoRA on a MoE base's experts and router: PEFT's fused `target_parameters` layout, the older
per-expert module layout and the router, validated against the base and loaded into one
per-expert layout equal to peft's own delta weights."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.expert_adapters import EXPERT_PARAMS, expert_adapter, moe_base, to_per_expert_layout

from loraplex.adapters.peft_format import AdapterFormatError, parse_adapter_config
from loraplex.adapters.targets import ResolvedTargets
from loraplex.adapters.validation import AdapterValidationError, validate_adapter
from loraplex.adapters.weights import load_adapter_dir, read_adapter_dir
from loraplex.bench._synthetic.models import hf_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("peft")


def _validate(path, base_config: dict, max_rank: int = 64):
    cfg, weights = read_adapter_dir(path)
    return validate_adapter(cfg, weights, len(weights), base_config, max_rank=max_rank)


def _peft_delta(path, base, layer: int, param: str) -> torch.Tensor:
    """peft's own delta weight of a targeted parameter ([E, out, in] or [E_router, H])."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, str(path))
    mlp = model.base_model.model.model.layers[layer].mlp
    module = mlp.gate if param == "gate" else mlp.experts
    name = "weight" if param == "gate" else param
    while module.parameter_name != name:
        module = module.base_layer
    return module.get_delta_weight("default").detach()


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_peft_fused_expert_adapter_validates_and_loads_as_peft_reads_it(tmp_path, arch):
    base = moe_base(arch)
    cfg = base.config.to_dict()
    path = expert_adapter(base, tmp_path / "a", seed=3, rank_pattern={"down_proj": 2})
    result = _validate(path, cfg)
    mods = {m for _, m in result.targets.modules}
    assert mods == {"q_proj", "experts.gate_up_proj", "experts.down_proj", "router"}
    assert ResolvedTargets.from_json(result.targets.to_json()) == result.targets
    loaded = load_adapter_dir(path, cfg)
    for layer in range(cfg["num_hidden_layers"]):
        x = loaded.experts[layer]
        assert x.w2_a.shape[1] == 2 and x.w13_a.shape[1] == 4  # rank_pattern applies per tensor
        gate_up = torch.einsum("eor,eri->eoi", x.w13_b, x.w13_a)
        down = torch.einsum("eor,eri->eoi", x.w2_b, x.w2_a)
        want = _peft_delta(path, moe_base(arch), layer, "gate_up_proj")
        torch.testing.assert_close(gate_up, want, atol=1e-6, rtol=1e-5)
        want = _peft_delta(path, moe_base(arch), layer, "down_proj")
        torch.testing.assert_close(down, want, atol=1e-6, rtol=1e-5)
        router = x.router_b @ x.router_a
        torch.testing.assert_close(router, _peft_delta(path, moe_base(arch), layer, "gate"))


@pytest.mark.parametrize("legacy", [False, True])
def test_per_expert_module_layout_loads_to_the_same_deltas(tmp_path, legacy):
    base = moe_base("mixtral")
    cfg = base.config.to_dict()
    fused = expert_adapter(base, tmp_path / "fused", seed=5)
    per = to_per_expert_layout(fused, tmp_path / "per", 4, legacy=legacy)
    result = _validate(per, cfg)
    assert {m for _, m in result.targets.modules} == {
        "q_proj", "per_expert.gate_proj", "per_expert.up_proj", "per_expert.down_proj", "router",
    }  # fmt: skip
    a, b = load_adapter_dir(fused, cfg), load_adapter_dir(per, cfg)
    for layer in (0, 1):
        xa, xb = a.experts[layer], b.experts[layer]
        for w_a, w_b in (("w13_a", "w13_b"), ("w2_a", "w2_b")):
            da = torch.einsum("eor,eri->eoi", getattr(xa, w_b), getattr(xa, w_a))
            db = torch.einsum("eor,eri->eoi", getattr(xb, w_b), getattr(xb, w_a))
            torch.testing.assert_close(da, db, atol=1e-6, rtol=1e-5)


def test_qwen2_moe_all_linear_adapter_targets_the_shared_expert(tmp_path):
    base = moe_base("qwen2_moe")
    path = expert_adapter(base, tmp_path / "a", seed=2, target_modules="all-linear")
    result = _validate(path, base.config.to_dict())
    shared = {"shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj",
              "shared_expert_gate"}  # fmt: skip
    assert shared <= {m for _, m in result.targets.modules}
    x = load_adapter_dir(path, base.config.to_dict()).experts[0]
    assert x.shared13_b.shape == (2 * 48, 8) and x.shared_gate_b.shape == (1, 4)


def _rewrite(path, fn) -> None:
    f = path / "adapter_model.safetensors"
    tensors = load_file(str(f))
    save_file(fn(tensors), str(f))


def test_refusals_name_what_is_wrong(tmp_path):
    base = moe_base("mixtral")
    cfg = base.config.to_dict()
    with pytest.raises(AdapterFormatError, match="'self_attn.q_proj.weight' is not served"):
        parse_adapter_config(
            {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
             "target_parameters": ["self_attn.q_proj.weight"]}
        )  # fmt: skip
    dense = hf_config("llama").to_dict()
    path = expert_adapter(base, tmp_path / "a", seed=3)
    with pytest.raises(AdapterValidationError, match="needs a mixture-of-experts base"):
        _validate(path, dense)
    key = "base_model.model.model.layers.0.mlp.experts.lora_A.weight"
    _rewrite(path, lambda t: t | {key: t[key][:-1]})
    with pytest.raises(AdapterValidationError, match="needs lora_A of shape") as exc:
        _validate(path, cfg)
    assert exc.value.code == "shape_mismatch"
    path = expert_adapter(base, tmp_path / "b", seed=3)
    _rewrite(path, lambda t: {k: v for k, v in t.items() if "layers.1.mlp.gate.lora_B" not in k})
    with pytest.raises(AdapterValidationError, match="lora_A but no lora_B"):
        _validate(path, cfg)
    path = expert_adapter(base, tmp_path / "b2", seed=3)  # target_parameters names the router
    _rewrite(path, lambda t: {k: v for k, v in t.items() if "layers.1.mlp.gate.lora" not in k})
    with pytest.raises(AdapterValidationError, match="layers.1.router but the weights have no"):
        _validate(path, cfg)
    with pytest.raises(AdapterFormatError, match="layer 1 router is targeted but"):
        load_adapter_dir(path, cfg)
    path = expert_adapter(base, tmp_path / "c", seed=3, params=["mlp.experts.down_proj"])
    raw = json.loads((path / "adapter_config.json").read_text())
    assert raw["target_parameters"] == ["mlp.experts.down_proj"]
    _validate(path, cfg)  # one fused tensor: no nesting
    per = to_per_expert_layout(expert_adapter(base, tmp_path / "d", seed=3), tmp_path / "per", 4)
    _rewrite(per, lambda t: {k: v for k, v in t.items() if ".experts.3.up_proj" not in k})
    with pytest.raises(AdapterValidationError, match="experts.3.up_proj but the weights have no"):
        _validate(per, cfg)
    assert EXPERT_PARAMS  # the helper's targets are the ones the issue names

"""Tiny MoE bases and PEFT adapters on their experts and router, made by `peft` itself, plus
the same adapters rewritten in the older per-expert module layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from loraplex.bench._synthetic.models import hf_config, random_model

from .peft_adapters import make_adapter

EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"]

MOE_CONFIGS: dict[str, dict[str, Any]] = {
    "mixtral": dict(intermediate_size=80, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(
        intermediate_size=80, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40,
        shared_expert_intermediate_size=48, norm_topk_prob=False,
    ),
    "qwen3_moe": dict(
        intermediate_size=80, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
}  # fmt: skip


def moe_base(arch: str, seed: int = 4) -> torch.nn.Module:
    """A tiny random transformers MoE causal LM of `arch` (one of MOE_CONFIGS)."""
    hf = random_model(hf_config(arch, **MOE_CONFIGS[arch]), seed=seed)
    hf.generation_config.eos_token_id = None
    return hf


def expert_adapter(
    base: torch.nn.Module, path: Path, seed: int, params: list[str] | None = None, **kw: Any
) -> Path:
    """A peft LoRA on the experts' fused tensors and the router (+ q_proj unless told)."""
    kw.setdefault("r", 4)
    kw.setdefault("lora_alpha", 8)
    kw.setdefault("target_modules", ["q_proj"])
    return make_adapter(
        base, path, seed, target_parameters=EXPERT_PARAMS if params is None else params, **kw
    )


def to_per_expert_layout(src: Path, dst: Path, num_experts: int, legacy: bool = False) -> Path:
    """Rewrite a fused expert adapter (gate_up, down, router targeted) as per-expert modules
    (`experts.{e}.gate_proj|up_proj|down_proj`, or Mixtral's legacy `block_sparse_moe` w1/w3/w2),
    the gate and up halves of each expert's fused B split into their own pairs."""
    cfg = json.loads((src / "adapter_config.json").read_text())
    tensors = load_file(str(src / "adapter_model.safetensors"))
    block = "block_sparse_moe" if legacy else "mlp"
    names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"} if legacy else {}
    out: dict[str, torch.Tensor] = {}
    prefix = "base_model.model.model.layers."
    for name, t in tensors.items():
        if ".mlp.experts." not in name:
            out[name.replace(".mlp.gate.", f".{block}.gate.")] = t
            continue
        layer = name[len(prefix) :].split(".", 1)[0]
        kind = "A" if ".lora_A." in name else "B"
        other = name.replace(f"lora_{kind}", "lora_B" if kind == "A" else "lora_A")
        a, b = (t, tensors[other]) if kind == "A" else (tensors[other], t)
        if kind == "B":
            continue
        projs = ["gate_up_proj"] if ".base_layer." in name else ["down_proj"]
        a_e = a.reshape(num_experts, -1, a.shape[-1])
        b_e = b.reshape(b.shape[0], -1, num_experts).permute(2, 0, 1)
        for e in range(num_experts):
            base = f"{prefix}{layer}.{block}.experts.{e}."
            if projs == ["down_proj"]:
                parts = {"down_proj": (a_e[e], b_e[e])}
            else:
                half = b_e.shape[1] // 2
                parts = {"gate_proj": (a_e[e], b_e[e][:half]), "up_proj": (a_e[e], b_e[e][half:])}
            for proj, (pa, pb) in parts.items():
                n = names.get(proj, proj)
                out[f"{base}{n}.lora_A.weight"] = pa.clone()
                out[f"{base}{n}.lora_B.weight"] = pb.clone()
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "adapter_model.safetensors"))
    mods = ["w1", "w2", "w3"] if legacy else ["gate_proj", "up_proj", "down_proj"]
    cfg["target_modules"] = sorted(set(cfg.get("target_modules") or []) | set(mods) | {"gate"})
    cfg.pop("target_parameters", None)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst

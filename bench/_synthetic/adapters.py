"""Random LoRA adapters in PEFT's on-disk layout (config + safetensors), written directly
from a base model's config: no peft needed, any rank, any set of projections."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

PROJECTIONS: dict[str, str] = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
"""Every LoRA-targetable projection of a Llama-family decoder layer, with its block."""


def write_random_adapter(
    path: Path,
    hf_config: dict[str, Any],
    rank: int,
    seed: int,
    *,
    targets: Sequence[str] = tuple(PROJECTIONS),
    std: float = 0.02,
) -> Path:
    """A PEFT-format LoRA adapter of `rank` on `targets` of every layer, A and B ~ N(0, std)
    (drawn layer by layer, target by target, A then B), alpha = 2 x rank."""
    from safetensors.torch import save_file

    from loraplex.adapters.peft_format import module_dims

    dims = module_dims(hf_config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(hf_config["num_hidden_layers"]):
        for m in targets:
            d_in, d_out = dims[m]
            prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[m]}.{m}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) * std
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    cfg = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return path


def peft_multi_adapter_model(hf: torch.nn.Module, dirs: Sequence[Path]) -> Any:
    """`hf` wrapped by peft with every adapter of `dirs` loaded, named a0, a1, ..."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(hf, str(dirs[0]), adapter_name="a0")
    for i, d in enumerate(dirs[1:], start=1):
        model.load_adapter(str(d), adapter_name=f"a{i}")
    return model.eval()

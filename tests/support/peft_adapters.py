"""PEFT LoRA adapters made by `peft` itself (the oracle's own files) over a transformers base:
`make_adapter` (an in-memory base, random A and B), `peft_adapter_dir` (a saved base folder,
peft's non-zero init), `make_peft_adapter` (a saved base, random B, q/v/down)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch


def make_adapter(base: torch.nn.Module, path: Path, seed: int, **lora_kwargs: Any) -> Path:
    """Build a PEFT LoRA over a copy of `base` with random nonzero A and B; save it to `path`."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(**lora_kwargs)
    model = get_peft_model(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(path)
    return path


def peft_adapter_dir(
    model_dir: Path,
    out: Path,
    *,
    r: int = 4,
    alpha: float = 8,
    targets: Any = ("q_proj", "v_proj"),
    **lora: Any,
) -> Path:
    """A PEFT LoRA adapter over the Llama at `model_dir`, peft's own (non-zero) init."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    target = list(targets) if not isinstance(targets, str) else targets
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=target,
        lora_dropout=0.0,
        init_lora_weights=False,
        **lora,
    )
    get_peft_model(model, cfg).save_pretrained(out)
    return out


def make_peft_adapter(model_dir: Path, out: Path, seed: int, rank: int = 8) -> Path:
    """A random (non-zero B) PEFT LoRA adapter on q/v/down for the model at `model_dir`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    cfg = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False,
    )
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(str(out))
    return out

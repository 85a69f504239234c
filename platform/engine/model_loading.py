"""Build an engine model from a local HuggingFace folder: resolve its class, load weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from loraplex.platform.engine.hf_folder import iter_weights, read_config
from loraplex.platform.engine.models.registry import resolve_model_class

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def resolve_dtype(
    dtype: str | torch.dtype | None, config: dict[str, Any] | None = None
) -> torch.dtype:
    """A torch dtype from a name, a dtype, or "auto"/None (the config's `dtype`/`torch_dtype`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        name = (config or {}).get("dtype") or (config or {}).get("torch_dtype") or "float32"
        return DTYPES.get(str(name), torch.float32)
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_model(
    path: str | Path,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device = "cpu",
) -> nn.Module:
    """The model in `path` with its weights, on `device`, in eval mode (no grad needed)."""
    config = read_config(path)
    cls = resolve_model_class(config)
    torch_dtype = resolve_dtype(dtype, config)
    with torch.device(device):
        model = cls(config, torch_dtype)
    model.load_weights(iter_weights(path))
    model.eval()
    model.requires_grad_(False)
    return model

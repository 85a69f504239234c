"""peft's fp32 logprobs over a transformers base, with an adapter or without (None): the
oracle the engine's LoRA tests compare against."""

from __future__ import annotations

import copy
from pathlib import Path

import torch


def peft_logprobs(hf: torch.nn.Module, adapter_dir: Path | str | None, tokens: list[int]):
    """log_softmax of the logits at every position of `tokens` ([len(tokens), V], fp32)."""
    from peft import PeftModel

    model = copy.deepcopy(hf)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)

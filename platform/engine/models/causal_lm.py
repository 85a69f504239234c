"""What every served model class is, so the engine builds and loads one without knowing which.

A served class is built as `cls(hf_config, dtype)` (under the engine's device and quantization
contexts), filled by `load_weights` from a checkpoint's (name, tensor) pairs, and runs
`forward(input_ids, positions)` -> hidden states, `compute_logits(hidden)` -> logits.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class CausalLM(nn.Module):
    """The base of the registered model classes (`registry.register_model`)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] in the model's dtype."""
        raise NotImplementedError(f"{type(self).__name__} does not compute logits")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load a HuggingFace checkpoint's (name, tensor) pairs into the model."""
        raise NotImplementedError(f"{type(self).__name__} does not load checkpoints")

"""Per-step state the layers read during one model forward (attention, LoRA and MoE metadata).

The model runner builds the metadata once per step and sets it here, so layer signatures stay
`forward(x)` and the multi-LoRA and MoE runtimes can add their own per-step state without
threading new arguments through every module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata


@dataclass
class ForwardContext:
    """What one forward step needs besides the token ids and positions."""

    attn: AttentionMetadata | None
    lora: object | None = None
    moe: object | None = None


_current: ForwardContext | None = None


def set_forward_context(ctx: ForwardContext | None) -> None:
    """Install `ctx` as the context of the forward about to run (None clears it)."""
    global _current
    _current = ctx


def get_forward_context() -> ForwardContext:
    """The context of the running forward; raises if the caller forgot to set one."""
    if _current is None:
        raise RuntimeError(
            "no forward context is set: wrap the model call in `forward_context(ForwardContext(...))`"
        )
    return _current


def peek_forward_context() -> ForwardContext | None:
    """The current context, or None when no forward is running (never raises)."""
    return _current


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    """Set `ctx` for the duration of a `with` block, restoring the previous one afterwards."""
    global _current
    previous = _current
    _current = ctx
    try:
        yield ctx
    finally:
        _current = previous

"""Gather a quantized Linear's checkpoint pieces (codes, scales, zeros, ...) by module prefix
as they stream in, in any order, until the module is complete: what every pre-quantized
checkpoint reader needs before it can emit the canonical layout."""

from __future__ import annotations

import torch


class ModuleParts:
    """Pieces per module prefix, handed back once every needed piece has arrived."""

    def __init__(self, format_name: str) -> None:
        self.format_name = format_name  # for the error message of `finish`
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def add(
        self, prefix: str, piece: str, tensor: torch.Tensor, needs: set[str]
    ) -> dict[str, torch.Tensor] | None:
        """Keep `tensor` as `piece` of `prefix`; the module's pieces once all of `needs` are in."""
        parts = self._pending.setdefault(prefix, {})
        parts[piece] = tensor.clone()  # a streamed tensor may be a view of a reused buffer
        if not needs <= parts.keys():
            return None
        return self._pending.pop(prefix)

    def finish(self) -> None:
        """Raise if a module's pieces never all arrived."""
        if self._pending:
            shown = ", ".join(sorted(self._pending)[:5])
            raise ValueError(f"{self.format_name} checkpoint lacks pieces of: {shown}")

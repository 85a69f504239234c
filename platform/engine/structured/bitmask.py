"""The next-token bitmask: filled on a worker thread while the forward runs, applied to the
logits before anything samples from them."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from loraplex.platform.engine.structured.state import GrammarState

MASK_THREADS = 2


def mask_words(vocab_size: int) -> int:
    """int32 words per row of a bitmask over `vocab_size` tokens."""
    return (vocab_size + 31) // 32


class MaskFiller:
    """Fills one step's bitmask rows (one per sampled row; unconstrained rows allow all)."""

    def __init__(self, vocab_size: int, threads: int = MASK_THREADS) -> None:
        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        self._threads = threads
        self._executor: object | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._mask: torch.Tensor | None = None

    def _exec(self) -> object:
        if self._executor is None:
            from llguidance import LLExecutor

            self._executor = LLExecutor(num_threads=self._threads)
        return self._executor

    def start(self, states: list[GrammarState | None]) -> bool:
        """Begin filling rows for `states` (row i for states[i]); False when none is
        constrained (nothing started)."""
        rows = [(s.matcher, i) for i, s in enumerate(states) if s is not None]
        if not rows:
            self._mask = None
            return False
        mask = torch.full((len(states), self.words), -1, dtype=torch.int32)
        self._mask, self._error = mask, None
        executor = self._exec()

        def fill() -> None:
            try:
                executor.unsafe_compute_mask_ptr(  # type: ignore[attr-defined]
                    rows, mask.data_ptr(), self.words * 4, len(states)
                )
            except BaseException as exc:  # noqa: BLE001 - re-raised by join()
                self._error = exc

        self._thread = threading.Thread(target=fill, name="grammar-mask", daemon=True)
        self._thread.start()
        return True

    def join(self) -> torch.Tensor | None:
        """Wait for the fill; the mask [rows, words] int32, or None when nothing was started."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        mask, self._mask = self._mask, None
        return mask

    def join_quietly(self) -> None:
        """Wait for a fill the step will not use (its forward failed); drop its result."""
        with contextlib.suppress(Exception):  # the step's own error is the one that matters
            self.join()


_BITS = torch.arange(32, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`logits` [S, V] with tokens whose bit is 0 in `mask` [S, words] set to -inf (in place;
    columns past the mask's width, e.g. padding of the embedding, are disallowed)."""
    s, v = logits.shape
    allowed = ((mask.unsqueeze(-1) >> _BITS) & 1).bool().view(s, -1)
    width = min(v, allowed.shape[1])
    logits[:, :width].masked_fill_(~allowed[:, :width].to(logits.device), float("-inf"))
    if v > width:
        logits[:, width:] = float("-inf")
    return logits

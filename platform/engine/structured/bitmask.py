"""The next-token bitmask: filled on a long-lived worker thread while the forward runs, applied
to the logits before anything samples from them.

One worker per filler, fed through a queue: starting a thread per step cost ~1 ms on a busy
2-core CPU (`Thread.start` waits until the new thread has a core). The worker makes one
llguidance executor call per step, which releases the GIL while the masks are computed, so
the forward's Python keeps running. `apply_bitmask` uses a small C kernel (`bitmask_cpu.c`)
that writes only the forbidden tokens; torch reads the bits where the kernel cannot be built.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from loraplex.loader.native_library import NativeLibrary

if TYPE_CHECKING:
    from loraplex.platform.engine.structured.state import GrammarState

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
# bitmask_cpu.c's apply_bitmask_rows(logits, rows, cols, row_stride, mask, words, mask_stride)
LIBRARY = NativeLibrary(
    Path(__file__).with_name("bitmask_cpu.c"),
    {"apply_bitmask_rows": ([_PTR, _I64, _I64, _I64, _PTR, _I64, _I64], None)},
)


def mask_words(vocab_size: int) -> int:
    """int32 words per row of a bitmask over `vocab_size` tokens."""
    return (vocab_size + 31) // 32


def default_mask_threads() -> int:
    """llguidance executor threads: one on a small CPU, where more would take cores from the
    forward's own threads; a quarter of the cores on a larger one."""
    return max(1, (os.cpu_count() or 1) // 4)


class _Worker:
    """The thread that runs fills; holds no reference to its filler, which stops it when
    collected."""

    def __init__(self, threads: int) -> None:
        from llguidance import LLExecutor

        self.executor: Any = LLExecutor(num_threads=threads)
        self.jobs: queue.SimpleQueue[tuple[list[tuple[Any, int]], torch.Tensor] | None]
        self.jobs = queue.SimpleQueue()
        self.done = threading.Event()
        self.done.set()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="grammar-mask", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            rows, mask = job
            try:
                self.executor.unsafe_compute_mask_ptr(
                    rows, mask.data_ptr(), mask.shape[1] * 4, mask.shape[0]
                )
            except BaseException as exc:  # noqa: BLE001 - re-raised by MaskFiller.join
                self.error = exc
            finally:
                self.done.set()

    def stop(self) -> None:
        self.jobs.put(None)


class MaskFiller:
    """Fills one step's bitmask rows (one per sampled row; unconstrained rows allow all)."""

    def __init__(self, vocab_size: int, threads: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        self._threads = threads or default_mask_threads()
        self._worker: _Worker | None = None
        self._mask: torch.Tensor | None = None

    def _started_worker(self) -> _Worker:
        if self._worker is None:
            self._worker = _Worker(self._threads)
            weakref.finalize(self, self._worker.stop)
        return self._worker

    @property
    def pending(self) -> bool:
        """True from `start` until `join`: a fill was handed to the worker."""
        return self._mask is not None

    def start(self, states: Sequence[GrammarState | None]) -> bool:
        """Hand the worker the rows of `states` (row i for states[i]) and return at once;
        False when none is constrained (nothing started)."""
        self.join_quietly()  # a fill its step never joined (none in the runner's paths)
        rows = [(s.matcher, i) for i, s in enumerate(states) if s is not None]
        if not rows:
            return False
        worker = self._started_worker()
        mask = torch.full((len(states), self.words), -1, dtype=torch.int32)
        worker.done.clear()
        self._mask = mask
        worker.jobs.put((rows, mask))
        return True

    def join(self) -> torch.Tensor | None:
        """Wait for the fill; the mask [rows, words] int32, or None when nothing was started."""
        mask, self._mask = self._mask, None
        if mask is None:
            return None
        worker = self._started_worker()
        worker.done.wait()
        if worker.error is not None:
            error, worker.error = worker.error, None
            raise error
        return mask

    def join_quietly(self) -> None:
        """Wait for a fill the step will not use (its forward failed); drop its result."""
        with contextlib.suppress(Exception):  # the step's own error is the one that matters
            self.join()

    def close(self) -> None:
        """Stop the worker thread (a new one starts if the filler is used again)."""
        self.join_quietly()
        if self._worker is not None:
            self._worker.stop()
            self._worker.thread.join()
            self._worker = None


_BITS = torch.arange(32, dtype=torch.int32)


def torch_apply(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`apply_bitmask` in torch ops (any dtype or device): every bit unpacked."""
    s, v = logits.shape
    allowed = ((mask.unsqueeze(-1) >> _BITS.to(mask.device)) & 1).bool().view(s, -1)
    width = min(v, allowed.shape[1])
    logits[:, :width].masked_fill_(~allowed[:, :width].to(logits.device), float("-inf"))
    if v > width:
        logits[:, width:] = float("-inf")
    return logits


def _native_ok(logits: torch.Tensor, mask: torch.Tensor) -> bool:
    return (
        logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(-1) == 1
        and mask.device.type == "cpu"
        and mask.dtype == torch.int32
        and mask.stride(-1) == 1
        and LIBRARY.available
    )


def native_apply(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`apply_bitmask` by the C kernel (fp32 CPU logits with stride-1 rows, int32 mask)."""
    if not _native_ok(logits, mask):
        raise ValueError(
            f"the native bitmask reads fp32 CPU logits and an int32 CPU mask with stride-1 "
            f"rows, got {logits.dtype} {tuple(logits.stride())} and {mask.dtype} on "
            f"{logits.device}/{mask.device} (library: {LIBRARY.error or 'built'})"
        )
    rows, cols = logits.shape
    if mask.shape[0] != rows:
        raise ValueError(f"{mask.shape[0]} mask rows for {rows} logits rows")
    LIBRARY.get("apply_bitmask_rows")(
        logits.data_ptr(), rows, cols, logits.stride(0), mask.data_ptr(), mask.shape[1],
        mask.stride(0),
    )  # fmt: skip
    return logits


def apply_bitmask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`logits` [S, V] with tokens whose bit is 0 in `mask` [S, words] set to -inf (in place;
    columns past the mask's width, e.g. padding of the embedding, are disallowed)."""
    if _native_ok(logits, mask):
        return native_apply(logits, mask)
    return torch_apply(logits, mask)

"""The bitmask's two halves: `MaskFiller` fills a step's rows on one long-lived worker thread
(no thread started per step: on a 2-core CPU a new thread waits for a core before `start`
returns), and `apply_bitmask` (the native kernel, or torch where it cannot be built) equals a
plain torch reading of the bits."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine.structured import GrammarSpec, bitmask
from loraplex.platform.engine.structured.bitmask import MaskFiller, apply_bitmask, mask_words
from loraplex.platform.engine.structured.compiler import GrammarCompiler


def reference_apply(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Bit j of word w allows token 32 * w + j; tokens past the mask are disallowed."""
    out = logits.clone()
    for r in range(out.shape[0]):
        for t in range(out.shape[1]):
            w, j = divmod(t, 32)
            if w >= mask.shape[1] or not (int(mask[r, w]) >> j) & 1:
                out[r, t] = float("-inf")
    return out


def random_mask(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Words all ones, all zeros, and mixed, as grammars produce them."""
    g = torch.Generator().manual_seed(seed)
    words = mask_words(vocab)
    mask = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=g, dtype=torch.int32)
    kind = torch.randint(0, 3, (rows, words), generator=g)
    mask[kind == 0] = -1
    mask[kind == 1] = 0
    return mask


@pytest.mark.parametrize("vocab,mask_vocab", [(1000, 1000), (96, 96), (70, 40), (33, 33)])
def test_apply_equals_the_reference(vocab: int, mask_vocab: int) -> None:
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab))
    mask = random_mask(5, mask_vocab, vocab)
    expected = reference_apply(logits, mask)
    got = apply_bitmask(logits.clone(), mask)
    assert torch.equal(got, expected)


def test_apply_uses_the_native_kernel_on_this_cpu() -> None:
    """The engine's path on a CPU: the C kernel, built here (torch's unpacking of every bit
    made a [rows, vocab] int32 temporary per step)."""
    assert bitmask.LIBRARY.available, bitmask.LIBRARY.error
    logits = torch.randn(3, 200)
    mask = random_mask(3, 200, 1)
    assert torch.equal(bitmask.native_apply(logits.clone(), mask), reference_apply(logits, mask))


def test_apply_on_bf16_logits_takes_the_torch_path() -> None:
    logits = torch.randn(2, 64).to(torch.bfloat16)
    mask = random_mask(2, 64, 3)
    assert torch.equal(apply_bitmask(logits.clone(), mask), reference_apply(logits, mask))


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> GrammarCompiler:
    model = make_demo_model(tmp_path_factory.mktemp("demo"))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    return GrammarCompiler((model / "tokenizer.json").read_text(), vocab, [0])


def test_one_worker_thread_fills_every_step(
    compiler: GrammarCompiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    filler = MaskFiller(compiler.vocab_size)
    spec = GrammarSpec("regex", "[a-c]{20}")
    states = [compiler.state_for(spec), None, compiler.state_for(spec)]
    for _ in range(5):
        assert filler.start(states)
        assert filler.pending
        mask = filler.join()
        assert mask is not None and not filler.pending
        assert bool((mask[1] == -1).all())  # an unconstrained row allows everything
        assert mask[0].ne(-1).any() and torch.equal(mask[0], mask[2])
    assert len(started) == 1, started
    filler.close()

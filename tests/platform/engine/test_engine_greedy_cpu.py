"""The native CPU argmax against torch.argmax: ties, NaN, ragged rows, bf16 and fp32."""

from __future__ import annotations

import shutil

import pytest
import torch

from loraplex.platform.engine.greedy_cpu import native_argmax, native_argmax_available

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine"
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 255, 256, 257, 1000, 32000])
def test_matches_torch_argmax(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(13, vocab, generator=g).to(dtype)
    logits[3] = -torch.inf  # every value tied at -inf: the first
    logits[4, :] = 0.0  # ties at zero, -0.0 first: the first
    logits[4, 0] = -0.0
    logits[5] = torch.randint(0, 3, (vocab,), generator=g).to(dtype)  # many ties at the max
    logits[6, vocab // 2] = torch.nan
    logits[7, -1] = torch.inf
    logits[8] = -logits[8].abs() - 1  # all negative
    assert native_argmax_available(logits)
    assert torch.equal(native_argmax(logits), logits.argmax(-1))


def test_reads_rows_of_a_wider_tensor_and_refuses_what_it_cannot_read():
    wide = torch.randn(6, 300)
    view = wide[:, :200]
    assert torch.equal(native_argmax(view), view.argmax(-1))
    assert not native_argmax_available(torch.randn(4, 8).half())
    assert not native_argmax_available(wide.t())
    with pytest.raises(ValueError, match="stride-1 rows"):
        native_argmax(wide.t())
    assert native_argmax(torch.empty(0, 5)).shape == (0,)

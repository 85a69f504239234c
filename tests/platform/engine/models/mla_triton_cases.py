"""Cases for test_deepseek_mla_triton.py, run under TRITON_INTERPRET=1: the Triton latent store
and decode kernels equal the torch path over a scrambled paged cache."""

from __future__ import annotations

import pytest
import torch

from loraplex.platform.engine.layers.mla_attention import _decode, write_latent
from loraplex.platform.engine.layers.mla_triton import mla_decode_triton, write_latent_triton


@pytest.mark.parametrize(("heads", "latent", "rope", "block"), [(4, 32, 8, 4), (3, 24, 8, 16)])
def test_mla_decode_kernel_matches_torch(heads, latent, rope, block):
    g = torch.Generator().manual_seed(heads + latent)
    num_blocks, row = 24, latent + rope
    lens = [1, 7, 29, 13]
    tables = torch.zeros(len(lens), 8, dtype=torch.int32)
    free = torch.randperm(num_blocks - 1, generator=g) + 1
    used = 0
    for s, n in enumerate(lens):
        k = -(-n // block)
        tables[s, :k] = free[used : used + k].to(torch.int32)
        used += k
    slots = torch.tensor(
        [
            int(tables[s, p // block]) * block + p % block
            for s, n in enumerate(lens)
            for p in range(n)
        ]
    )
    rows = torch.randn(len(slots), row, generator=g)
    ref_cache = torch.zeros(num_blocks, block, row)
    write_latent(ref_cache, rows, slots)
    cache = torch.zeros(num_blocks, block, row)
    padded = torch.cat((slots, torch.tensor([-1, -1])))
    write_latent_triton(cache, torch.cat((rows, torch.randn(2, row, generator=g))), padded)
    torch.testing.assert_close(cache, ref_cache, atol=0, rtol=0)  # padding rows skipped
    q = torch.randn(len(lens), heads, row, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    want = _decode(q, cache, tables, seq_lens, max(lens), 0.3, latent)
    got = mla_decode_triton(q, cache, tables, seq_lens, 0.3, latent)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_model_on_the_triton_path_matches_transformers(tmp_path, monkeypatch):
    """The attention layer's CUDA wiring (Triton store, Triton decode-only steps, torch for the
    rest), run on the CPU through the interpreter, still equals transformers."""
    pytest.importorskip("transformers")
    from test_deepseek_models import mixed_scenario, save_deepseek

    from loraplex.platform.engine.layers import mla_attention
    from loraplex.platform.engine.model_loading import load_model

    calls = []

    def decode(*args):
        calls.append(args[0].shape[0])
        return mla_decode_triton(*args)

    monkeypatch.setattr(mla_attention, "mla_triton_available_for", lambda t: True)
    monkeypatch.setattr(mla_attention, "mla_decode_triton", decode)
    hf = save_deepseek(tmp_path, "v3_yarn_interleaved")
    mixed_scenario(load_model(tmp_path, dtype="float32"), hf)
    assert calls  # the decode-only steps ran the kernel

"""bf16 decode attention on CPU runs SDPA in bf16 (no fp32 copy of the gathered K/V) and stays
within bf16 rounding of the fp32 result."""

from __future__ import annotations

import torch

from loraplex.platform.engine.layers.paged_attention_torch import decode_attention_torch


def test_bf16_decode_attention_close_to_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    s, hq, hkv, d, bs, lens = 4, 8, 2, 32, 4, [1, 7, 30, 61]
    width = max(-(-n // bs) for n in lens)
    kv = torch.randn(2, s * width + 1, bs, hkv, d, generator=g)
    tables = torch.randperm(s * width + 1, generator=g)[: s * width].view(s, width).int()
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(s, hq, d, generator=g)
    want = decode_attention_torch(q, kv, tables, seq_lens, max(lens), d**-0.5)
    got = decode_attention_torch(q.bfloat16(), kv.bfloat16(), tables, seq_lens, max(lens), d**-0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)

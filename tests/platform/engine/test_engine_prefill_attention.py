"""Prefill attention on the torch path (CPU): a chunk attends causally over its cached
context and itself, through the fused SDPA kernel."""

from __future__ import annotations

import pytest
import torch

from loraplex.platform.engine.layers.paged_attention_torch import prefill_attention_torch


def _prefill_case(
    n: int, context: int, hq: int, hkv: int, d: int, bs: int = 16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chunk of `n` queries after `context` cached tokens, its K/V in a shuffled paged
    cache; the dense K/V [L, Hkv, D] for a reference."""
    g = torch.Generator().manual_seed(n * 31 + context)
    seq_len = context + n
    blocks = -(-seq_len // bs)
    table = torch.randperm(blocks + 3, generator=g)[:blocks].to(torch.int32)
    cache = torch.randn(2, blocks + 3, bs, hkv, d, generator=g)
    k = cache[0][table.long()].reshape(-1, hkv, d)[:seq_len]
    v = cache[1][table.long()].reshape(-1, hkv, d)[:seq_len]
    q = torch.randn(n, hq, d, generator=g)
    return q, cache, table, k, v


@pytest.mark.parametrize(
    ("n", "context", "hq", "hkv"), [(97, 0, 4, 4), (64, 80, 8, 2), (1, 33, 4, 2)]
)
def test_prefill_chunks_match_a_float64_reference(n: int, context: int, hq: int, hkv: int) -> None:
    """A prefill chunk attends causally over its context and itself (GQA included)."""
    d = 32
    q, cache, table, k, v = _prefill_case(n, context, hq, hkv, d)
    out = prefill_attention_torch(q, cache, table, context, context + n, d**-0.5)
    rep = hq // hkv
    kk, vv = (x.double().repeat_interleave(rep, 1).transpose(0, 1) for x in (k, v))
    scores = q.double().transpose(0, 1) @ kk.transpose(1, 2) * d**-0.5  # [H, n, L]
    allowed = torch.arange(context + n)[None, :] <= (torch.arange(n) + context)[:, None]
    ref = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv).transpose(0, 1)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_prefill_attention_runs_the_fused_cpu_kernel() -> None:
    """Prefill attention never materializes the [n, L] score matrix: the math path of SDPA
    (a dense mask, scores and softmax in memory) cost 2.5-5x the fused CPU kernel on a
    1,500-token prompt, and a long prompt's step is every tenant's step."""
    d = 32
    for context in (0, 48):
        q, cache, table, _, _ = _prefill_case(64, context, 4, 2, d)
        with torch.profiler.profile() as prof:
            prefill_attention_torch(q, cache, table, context, context + 64, d**-0.5)
        ops = {e.key for e in prof.key_averages()}
        assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops, sorted(ops)
        assert "aten::_scaled_dot_product_attention_math" not in ops

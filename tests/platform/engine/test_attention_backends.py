"""One AttentionBackend Protocol, every paged-attention implementation behind it, chosen once.

Each backend the machine can run writes a mixed step's K/V into a paged cache and attends over
it; the result is compared with plain causal attention computed here from the unpaged K/V. The
choice is made when `allocate_kv_cache` binds a layer's cache: after that, a forward never asks
which kernels are available (the probes are made to fail and the model still runs).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.layers import attention as attention_mod
from loraplex.platform.engine.layers import paged_attention_cpu, paged_attention_triton
from loraplex.platform.engine.layers.attention_backend import (
    AttentionBackend,
    FixedOrderAttention,
    NativeCpuAttention,
    choose_attention_backend,
)
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.paged_attention_torch import NO_SCALES, TorchAttention
from loraplex.platform.engine.layers.paged_attention_triton import TritonAttention

HAS_CC = bool(shutil.which("cc") or shutil.which("gcc"))
HQ, HKV, D, BS = 4, 2, 16, 4


def _mixed_step(dtype: torch.dtype):
    """Sequence 0 has 5 cached tokens and decodes one; sequence 1 prefills 3 (none cached)."""
    g = torch.Generator().manual_seed(0)
    lens = [6, 3]
    ctx = [5, 0]
    tables = torch.tensor([[3, 1], [2, 0]], dtype=torch.int32)
    k_all = [torch.randn(n, HKV, D, generator=g).to(dtype) for n in lens]
    v_all = [torch.randn(n, HKV, D, generator=g).to(dtype) for n in lens]
    cache = torch.zeros(2, 4, BS, HKV, D, dtype=dtype)
    for s in range(2):  # the cached context goes in directly
        for p in range(ctx[s]):
            b, o = int(tables[s, p // BS]), p % BS
            cache[0, b, o], cache[1, b, o] = k_all[s][p], v_all[s][p]
    new = [(s, p) for s in range(2) for p in range(ctx[s], lens[s])]
    slots = [int(tables[s, p // BS]) * BS + p % BS for s, p in new]
    k = torch.stack([k_all[s][p] for s, p in new])
    v = torch.stack([v_all[s][p] for s, p in new])
    q = torch.randn(len(new), HQ, D, generator=g).to(dtype)
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor([0, 1, 4], dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        context_lens=torch.tensor(ctx, dtype=torch.int32),
        block_tables=tables,
        max_query_len=3,
        max_seq_len=6,
        is_decode_only=False,
    )
    want = []
    for i, (s, p) in enumerate(new):  # plain causal attention over the unpaged rows
        keys = k_all[s][: p + 1].float().repeat_interleave(HQ // HKV, dim=1)  # [L, HQ, D]
        vals = v_all[s][: p + 1].float().repeat_interleave(HQ // HKV, dim=1)
        w = torch.softmax(torch.einsum("hd,lhd->hl", q[i].float(), keys) * D**-0.5, dim=-1)
        want.append(torch.einsum("hl,lhd->hd", w, vals))
    return cache, k, v, q, md, torch.stack(want)


def _cpu_backends() -> list[AttentionBackend]:
    found: list[AttentionBackend] = [TorchAttention()]
    if HAS_CC:
        found += [NativeCpuAttention(), FixedOrderAttention()]
    return found


@pytest.mark.parametrize("backend", _cpu_backends(), ids=lambda b: b.name)
def test_each_backend_is_an_attention_backend_and_matches_plain_attention(backend):
    assert isinstance(backend, AttentionBackend)
    cache, k, v, q, md, want = _mixed_step(torch.float32)
    backend.write_kv(cache, k, v, md.slot_mapping, NO_SCALES)
    got = backend.attend(q, cache, md, D**-0.5, NO_SCALES)
    torch.testing.assert_close(got.float(), want, atol=1e-5, rtol=1e-5)


def test_triton_backend_is_an_attention_backend():
    """Its kernels run under TRITON_INTERPRET in test_engine_paged_attention_triton."""
    assert isinstance(TritonAttention(), AttentionBackend)


def test_the_choice_follows_the_cache():
    fp32 = torch.zeros(2, 1, BS, HKV, D)
    fp8 = fp32.to(torch.float8_e4m3fn)
    assert isinstance(choose_attention_backend(fp8, fixed_order=False), TorchAttention)
    if HAS_CC:
        assert isinstance(choose_attention_backend(fp32, fixed_order=False), NativeCpuAttention)
        assert isinstance(choose_attention_backend(fp32, fixed_order=True), FixedOrderAttention)


def test_the_backend_is_chosen_once_when_the_cache_is_bound(monkeypatch):
    """After allocate_kv_cache no forward asks which kernels exist (today's per-call if/elif
    did, for every layer and step)."""
    from support.paged_harness import PagedHarness

    from loraplex.bench._synthetic.models import save_tiny_model
    from loraplex.platform.engine.model_loading import load_model

    pytest.importorskip("transformers")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_model(tmp, "llama", with_tokenizer=False)
        h = PagedHarness(load_model(tmp, dtype="float32"), block_size=4)
    layers = [m for m in h.model.modules() if isinstance(m, attention_mod.Attention)]
    chosen = [layer.backend for layer in layers]
    assert all(isinstance(b, AttentionBackend) for b in chosen)

    def asked(*_args: object) -> bool:
        raise AssertionError("a forward asked which attention kernels are available")

    for mod, name in (
        (attention_mod, "triton_available_for"),
        (attention_mod, "native_decode_available"),
        (paged_attention_triton, "triton_available_for"),
        (paged_attention_cpu, "native_decode_available"),
    ):
        monkeypatch.setattr(mod, name, asked, raising=False)
    h.step([("a", list(range(5, 14)))])
    h.step([("a", [3])])
    assert [layer.backend for layer in layers] == chosen


def test_forward_uses_the_bound_backend():
    """A layer calls its backend (here a counting wrapper set in place of the chosen one)."""
    layer = attention_mod.Attention(HQ, HKV, D, D**-0.5, 0)
    cache, k, v, q, md, want = _mixed_step(torch.float32)
    layer.kv_cache = cache
    calls: list[str] = []

    class Counting(TorchAttention):
        def attend(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append("attend")
            return super().attend(*args, **kwargs)

    layer.backend = Counting()
    with forward_context(ForwardContext(attn=md)):
        out = layer(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(k.shape[0], -1))
    assert calls == ["attend"]
    torch.testing.assert_close(out.view(-1, HQ, D), want, atol=1e-5, rtol=1e-5)

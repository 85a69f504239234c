"""The native CPU decode attention and KV write against the torch path they replace."""

from __future__ import annotations

import shutil

import pytest
import torch

from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.layers.paged_attention_cpu import (
    native_decode_attention,
    native_decode_available,
    native_decode_status,
    native_write_kv,
)
from loraplex.platform.engine.layers.paged_attention_torch import (
    decode_attention_torch,
    paged_attention_torch,
    write_kv_torch,
)

# Without a C compiler the engine keeps the torch path (test_loader_native_library covers that).
pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine"
)


def random_cache(dtype, hkv=4, d=32, blocks=256, bs=16, seqs=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, blocks, bs, hkv, d, generator=g).to(dtype)
    lens = torch.randint(1, 6 * bs, (seqs,), generator=g, dtype=torch.int32)
    lens[0] = 6 * bs  # one sequence fills its table exactly
    tables = torch.randperm(blocks, generator=g)[: seqs * 6].view(seqs, 6).int()
    return kv, tables, lens


def test_native_kernel_builds_here():
    assert native_decode_status().startswith("native"), native_decode_status()


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(8, 4, 32), (4, 4, 64), (16, 2, 128), (6, 3, 40)])
def test_decode_matches_torch_gather(dtype, tol, hq, hkv, d):
    """Head sizes the kernel unrolls (32, 64, 128) and one it does not (40); GQA groups 1-8."""
    kv, tables, lens = random_cache(dtype, hkv=hkv, d=d)
    q = torch.randn(lens.shape[0], hq, d).to(dtype)
    assert native_decode_available(q, kv)
    want = decode_attention_torch(q, kv, tables, lens, int(lens.max()), 0.125)
    got = native_decode_attention(q, kv, tables, lens, int(lens.max()), 0.125)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_decode_on_two_threads_equals_one():
    kv, tables, lens = random_cache(torch.float32, seqs=23)
    q = torch.randn(23, 8, 32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_decode_attention(q, kv, tables, lens, int(lens.max()), 0.2)
        torch.set_num_threads(2)
        two = native_decode_attention(q, kv, tables, lens, int(lens.max()), 0.2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_fp8_and_mixed_dtypes_stay_on_the_torch_path():
    kv, _, _ = random_cache(torch.float32)
    assert not native_decode_available(torch.randn(2, 8, 32).bfloat16(), kv)
    assert not native_decode_available(torch.randn(2, 8, 32), kv.to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="fp32 or bf16"):
        native_decode_attention(
            torch.randn(2, 8, 32).bfloat16(), kv, torch.zeros(2, 6, dtype=torch.int32),
            torch.ones(2, dtype=torch.int32), 1, 0.1,
        )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_torch_and_skips_padding(dtype):
    """Strided k/v rows (views into a fused qkv output) and slot -1 padding."""
    kv_native, _, _ = random_cache(dtype)
    kv_torch = kv_native.clone()
    qkv = torch.randn(7, 3 * 4 * 32).to(dtype)
    k = qkv[:, 128:256].view(7, 4, 32)
    v = qkv[:, 256:].view(7, 4, 32)
    slots = torch.tensor([5, 17, -1, 300, 4095, -1, 64])
    native_write_kv(kv_native, k, v, slots)
    write_kv_torch(kv_torch, k, v, slots)
    assert torch.equal(kv_native, kv_torch)


def test_write_kv_refuses_rows_it_cannot_copy():
    kv, _, _ = random_cache(torch.float32)
    k = torch.randn(3, 32, 4).transpose(1, 2)  # [3, 4, 32] with head_dim not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        native_write_kv(kv, k, k, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="does not fit"):
        native_write_kv(
            kv, torch.randn(3, 4, 32).bfloat16(), torch.randn(3, 4, 32), torch.arange(3)
        )


def test_mixed_batch_decode_rows_through_native_kernel_match_torch():
    """Prefill chunks and decode rows in one batch: decodes take the native kernel."""
    kv, tables, lens = random_cache(torch.float32, seqs=3)
    lens = torch.tensor([40, 17, 5], dtype=torch.int32)  # seq 1 decodes, 0 and 2 prefill
    q = torch.randn(1 + 1 + 2, 8, 32)  # seq 0: its last token; seq 1: one; seq 2: two
    q_start = torch.tensor([0, 1, 2, 4], dtype=torch.int32)
    md = AttentionMetadata(
        slot_mapping=torch.full((4,), -1), query_start_loc=q_start, seq_lens=lens,
        context_lens=lens - torch.tensor([1, 1, 2], dtype=torch.int32), block_tables=tables,
        max_query_len=2, max_seq_len=40, is_decode_only=False,
    )  # fmt: skip
    want = paged_attention_torch(q, kv, md, 0.2)
    md.cache.clear()
    got = paged_attention_torch(q, kv, md, 0.2, native_decode_attention)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_loading_the_kernels_keeps_subnormals():
    """Linking with -ffast-math would flush subnormals to zero process-wide (crtfastmath.o):
    fp8 decoding and anything else relying on them would silently change."""
    from loraplex.adapters.kernels.lora_cpu import native_lora_status

    assert native_lora_status().startswith("native") and native_decode_status().startswith("native")
    tiny = torch.tensor([1e-40])
    assert (tiny * 1.0).item() > 0.0

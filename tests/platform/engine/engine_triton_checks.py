"""Run in a subprocess with TRITON_INTERPRET=1 (set before triton is imported) by
test_engine_paged_attention_triton.py: compares the Triton paged-KV kernels with the torch path
and prints one JSON line of {case: max_abs_error}."""

from __future__ import annotations

import json
import os
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1")

import torch  # noqa: E402

from loraplex.platform.engine.layers import attention_backend  # noqa: E402
from loraplex.platform.engine.layers.paged_attention_torch import (  # noqa: E402
    KVScales,
    decode_attention_torch,
    write_kv_torch,
)
from loraplex.platform.engine.layers.paged_attention_triton import (  # noqa: E402
    decode_attention_triton,
    write_kv_triton,
)

DECODE_CASES = {
    # name: (S, Hq, Hkv, D, block_size, seq_lens, dtype)
    "gqa_fp32": (4, 8, 2, 16, 4, [1, 4, 9, 23], torch.float32),
    "mha_bs16": (3, 4, 4, 32, 16, [16, 17, 40], torch.float32),
    "mqa_dim24": (2, 6, 1, 24, 8, [5, 30], torch.float32),
    "gqa_fp16": (3, 4, 2, 16, 4, [3, 12, 21], torch.float16),
}


def decode_case(s, hq, hkv, d, bs, lens, dtype) -> float:
    g = torch.Generator().manual_seed(0)
    num_blocks = 64
    kv = torch.randn(2, num_blocks, bs, hkv, d, generator=g).to(dtype)
    width = max(-(-n // bs) for n in lens) + 1
    perm = torch.randperm(num_blocks, generator=g)[: s * width].view(s, width).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(s, hq, d, generator=g).to(dtype)
    scale = d**-0.5
    got = decode_attention_triton(q, kv, perm, seq_lens, scale).float()
    ref = decode_attention_torch(q, kv, perm, seq_lens, max(lens), scale).float()
    return float((got - ref).abs().max())


def store_case() -> float:
    g = torch.Generator().manual_seed(1)
    kv_a = torch.randn(2, 10, 4, 2, 16, generator=g)
    kv_b = kv_a.clone()
    qkv = torch.randn(6, 3, 2, 16, generator=g)  # k, v as strided views like the model's split
    k, v = qkv[:, 1], qkv[:, 2]
    slots = torch.tensor([0, -1, 7, 39, -1, 12])
    write_kv_triton(kv_a, k, v, slots)
    write_kv_torch(kv_b, k, v, slots)
    untouched = kv_a.view(2, -1, 2, 16)[:, 1].abs().sum() > 0  # slot 1 kept its random data
    return float((kv_a - kv_b).abs().max()) if untouched else float("inf")


def fp8_cases(scales: KVScales, tag: str) -> dict[str, float]:
    """An e4m3 cache with per-layer or per-head scales: the Triton store and decode vs the
    torch path."""
    g = torch.Generator().manual_seed(2)
    s, hq, hkv, d, bs, lens = 3, 8, 2, 16, 4, [2, 9, 21]
    kv_a = torch.zeros(2, 32, bs, hkv, d, dtype=torch.float8_e4m3fn)
    kv_b = kv_a.clone()
    n = 32 * bs
    k, v = torch.randn(n, hkv, d, generator=g) * 3, torch.randn(n, hkv, d, generator=g) * 9
    slots = torch.randperm(n, generator=g)
    write_kv_triton(kv_a, k, v, slots, scales)
    write_kv_torch(kv_b, k, v, slots, scales)
    store = float((kv_a.float() - kv_b.float()).abs().max())
    width = max(-(-x // bs) for x in lens)
    tables = torch.randperm(32, generator=g)[: s * width].view(s, width).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(s, hq, d, generator=g)
    got = decode_attention_triton(q, kv_b, tables, seq_lens, d**-0.5, scales)
    ref = decode_attention_torch(q, kv_b, tables, seq_lens, max(lens), d**-0.5, scales)
    return {f"fp8_store_kv{tag}": store, f"fp8_decode{tag}": float((got - ref).abs().max())}


def model_case() -> float:
    """A whole Llama decode through the Attention module's Triton branch vs transformers."""
    from support.paged_harness import PagedHarness, hf_logits

    from loraplex.bench._synthetic.models import save_tiny_model
    from loraplex.platform.engine.model_loading import load_model

    # run the CUDA choice (TritonAttention) in the interpreter: the layers choose at bind time
    attention_backend.triton_available_for = lambda t: True
    with tempfile.TemporaryDirectory() as tmp:
        hf = save_tiny_model(tmp, "llama", with_tokenizer=False)
        h = PagedHarness(load_model(tmp, dtype="float32"), block_size=4)
        h.step([("a", list(range(5, 18))), ("b", list(range(40, 46)))])
        worst = 0.0
        # a mixed step (decode rows through the Triton kernel, a prefill chunk through torch),
        # then decode-only steps
        steps = [[("a", [3]), ("c", list(range(60, 70)))]]
        steps += [[("a", [7 + i]), ("b", [90 - i]), ("c", [20 + i])] for i in range(3)]
        for chunks in steps:
            out = h.step(chunks)
            for (seq, _), lg in zip(chunks, out, strict=True):
                ref = hf_logits(hf, h.tokens[seq])[-lg.shape[0] :]
                worst = max(worst, float((lg - ref).abs().max()))
        return worst


def main() -> None:
    results = {name: decode_case(*args) for name, args in DECODE_CASES.items()}
    results["store_kv"] = store_case()
    results.update(fp8_cases(KVScales(k=0.02, v=0.05), ""))
    per_head = KVScales(k=torch.tensor([0.02, 0.4]), v=torch.tensor([0.05, 0.003]))
    results.update(fp8_cases(per_head, "_per_head"))
    results["model_decode"] = model_case()
    sys.stdout.write("RESULTS " + json.dumps(results) + "\n")


if __name__ == "__main__":
    main()

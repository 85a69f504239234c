"""Cases for the Triton grouped MoE kernels over quantized experts under TRITON_INTERPRET=1.

Run by test_moe_quant_experts.py in a fresh interpreter with TRITON_INTERPRET=1 (Triton reads
it when the kernels are defined, and other tests import them first). For int8, int4 (sym and
asym, g128) and fp8 experts: decode- and prefill-sized batches, experts held on another rank
(strided views of a bigger stack, so the kernels must follow the strides) and fp16
activations, against the torch path on the dequantized stacks.
"""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run with TRITON_INTERPRET=1 (see test_moe_quant_experts.py)")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from loraplex.moe.experts_torch import fused_experts_torch  # noqa: E402
from loraplex.moe.experts_triton import fused_experts_triton  # noqa: E402
from loraplex.moe.quant_experts import QuantizedExperts, quantize_rows  # noqa: E402

SCHEMES = [("int8", True), ("int4", False), ("int4", True), ("fp8", True)]
CASES = {
    # name: (tokens, experts, top_k, hidden, inter, dtype, remote experts)
    "decode_fp32": (3, 4, 2, 128, 128, torch.float32, False),
    "prefill_fp32": (21, 4, 2, 128, 256, torch.float32, False),
    "remote_fp32": (13, 8, 2, 128, 128, torch.float32, True),
    "prefill_fp16": (11, 4, 2, 128, 128, torch.float16, False),
}


def _stack(kind, sym, w, dtype) -> QuantizedExperts:
    codes, scale = quantize_rows(kind, w, 128, sym, dtype)
    return QuantizedExperts(kind, codes, scale, 128 if kind == "int4" else 0)


def _float(q: QuantizedExperts) -> torch.Tensor:
    return torch.stack([q.dequantize(e, torch.float32) for e in range(q.shape[0])])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("kind", "sym"), SCHEMES)
def test_quantized_grouped_kernel_matches_torch(kind, sym, case):
    tokens, experts, top_k, hidden, inter, dtype, remote = CASES[case]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    q13 = _stack(kind, sym, torch.randn(experts, 2 * inter, hidden, generator=g) * 0.1, dtype)
    q2 = _stack(kind, sym, torch.randn(experts, hidden, inter, generator=g) * 0.1, dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g)
    emap = None
    if remote:  # this rank holds the odd experts, as strided views of the whole stack
        emap = torch.full((experts,), -1, dtype=torch.int64)
        emap[1::2] = torch.arange(experts // 2)
        q13, q2 = (
            QuantizedExperts(q.kind, q.codes[1::2], q.scale[1::2], q.group) for q in (q13, q2)
        )
        assert not q13.codes.is_contiguous()
    got = fused_experts_triton(x, q13, q2, weights, ids, emap).float()
    # the oracle: float stacks dequantized by the format's own definition
    ref = fused_experts_torch(x.float(), _float(q13), _float(q2), weights, ids, emap)
    assert ref.abs().max() > 0.05
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err < (2e-2 if dtype == torch.float16 else 1e-4), err
    # and the torch path over the same quantized stacks agrees
    torch_q = fused_experts_torch(x, q13, q2, weights, ids, emap).float()
    assert ((torch_q - ref).abs().max() / ref.abs().max()).item() < (
        2e-2 if dtype == torch.float16 else 1e-4
    )

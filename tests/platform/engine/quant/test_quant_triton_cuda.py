"""On a GPU (skipped without CUDA; `loraplex bench gpu-check` runs it): int8 / int4 Linears
built on CUDA switch to the Triton W8A16 / W4A16 GEMMs when loading finishes and match the
dequantize-then-matmul reference in bf16; a quantized engine on CUDA runs them in every
Linear and decodes the same greedy tokens from CUDA graphs as eagerly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.loader.quant import Quantizer, resolve_scheme  # noqa: E402
from loraplex.loader.quant.weight_only import dequantize_int4, dequantize_int8  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.layers.linear import Linear  # noqa: E402
from loraplex.platform.engine.layers.quant import linear_quantization  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SIZES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("choice", ["int8", "int4", "int4_sym"])
@pytest.mark.parametrize("tokens", [1, 16, 33])
def test_cuda_linear_runs_the_triton_gemm(choice: str, tokens: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    w = torch.randn(200, 512, generator=g) / 20
    with torch.device("cuda"), linear_quantization(resolve_scheme(choice)):
        layer = Linear(512, 200, bias=False, layer_idx=0, name="o_proj", dtype=torch.bfloat16)
    parts = {}
    for name, t in Quantizer(choice).apply("m.o_proj.weight", w):
        piece = name.rsplit(".", 1)[1]
        layer.load_slice("o_proj", t.cuda(), piece=piece)
        parts[piece] = t
    layer.finish_loading()
    assert layer.quant_kernel == "triton"
    q, s = parts["weight"], parts["weight_scale"]
    if choice == "int8":
        ref_w = dequantize_int8(q, s, torch.float32)
    else:
        assert layer.weight.shape == (200, 256)  # two codes a byte
        ref_w = dequantize_int4(
            q, s, parts.get("weight_zero", torch.full_like(s, 8.0)), torch.float32
        )
    x = torch.randn(tokens, 512, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        got = layer(x.cuda()).float().cpu()
    want = x.float() @ ref_w.T
    assert (got - want).abs().max() / want.abs().max() < 2e-2


@pytest.mark.parametrize("choice", ["int8", "int4"])
def test_quantized_engine_decodes_the_same_from_graphs_as_eager(
    tmp_path: Path, choice: str
) -> None:
    save_tiny_model(tmp_path, "llama", seed=5, with_tokenizer=False, **SIZES)
    kw = dict(device="cuda", block_size=16, max_num_seqs=4, quantization=choice, dtype="bfloat16")
    eager = LLM(str(tmp_path), enforce_eager=True, **kw)
    kernels = {m.quant_kernel for m in eager.core.model.modules() if hasattr(m, "quant_kernel")}
    assert kernels == {"triton"}
    graphed = LLM(str(tmp_path), **kw)
    assert graphed.core.runner.decode_graphs
    prompts = [[5, 6, 7], list(range(3, 30)), [9] * 11]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, greedy)]
    got = [o.outputs[0].token_ids for o in graphed.generate(prompts, greedy)]
    assert got == want

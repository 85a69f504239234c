"""The Triton LoRA kernels compiled natively on a GPU (skipped without CUDA).

Runs in a subprocess without TRITON_INTERPRET, which other test modules set process-wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = r"""
import sys, torch
sys.path.insert(0, {testdir!r})
from support.lora_reference import llama_specs, random_adapter
from loraplex.adapters.device_pool import DevicePool
from loraplex.adapters.kernels.lora_torch import lora_delta_torch
from loraplex.adapters.kernels.lora_triton import lora_delta_triton, triton_lora_available
from loraplex.adapters.metadata import build_lora_meta
dev = "cuda"
specs = llama_specs(num_layers=1)
pool = DevicePool(specs, capacity_bytes=8_000_000, max_lora_rank=64, device=dev)
ranks = [{{"q_proj": 4, "v_proj": 4}}, {{"q_proj": 64, "o_proj": 33, "down_proj": 16}},
         {{"k_proj": 20, "gate_proj": 48, "up_proj": 8}}]
res = [pool.load(random_adapter(f"k{{i}}", r, seed=i, num_layers=1)) for i, r in enumerate(ranks)]
seqs = [(res[0], 3), (None, 2), (res[1], 40), (res[2], 1), (res[0], 1)]
meta = build_lora_meta(seqs, max_loras=8, num_linears=len(specs), max_slices=3, device=dev, num_tokens=50)
for lid, s in enumerate(specs):
    x = torch.randn(50, s.in_features, device=dev)
    y0 = torch.randn(50, s.out_features, device=dev)
    assert triton_lora_available(x)
    y1, y2 = y0.clone(), y0.clone()
    lora_delta_triton(x, y1, pool.a[lid], pool.b[lid], meta, lid, s.slice_offsets, s.slice_sizes, 64)
    lora_delta_torch(x, y2, pool.a[lid], pool.b[lid], meta, lid, s.slice_offsets, s.slice_sizes)
    torch.testing.assert_close(y1, y2, atol=2e-3, rtol=2e-3)  # tf32 dots on the GPU
print("OK")
"""


def test_native_triton_matches_torch_on_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = SCRIPT.format(testdir=str(Path(__file__).parents[1]))  # tests/, for `support`
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-4000:]

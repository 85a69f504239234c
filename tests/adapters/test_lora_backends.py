"""One LoraBackend Protocol over the five LoRA delta paths, chosen once when the hooks are built.

Each CPU backend adds a mixed step's deltas (prefills, decodes, base tokens, an adapter in two
runs) for every Linear and is checked against the per-token oracle built from each adapter's
own A and B. The hooks choose their backend at construction: afterwards no call asks which
kernels are available (the probes are made to fail and the deltas still come out right).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from support.lora_reference import llama_specs, random_adapter, reference_delta

from loraplex.adapters.device_pool import DevicePool
from loraplex.adapters.kernels import lora_cpu, lora_triton
from loraplex.adapters.kernels.lora_backend import LoraBackend, SliceBounds
from loraplex.adapters.kernels.lora_cpu import NativeLora
from loraplex.adapters.kernels.lora_packed import PackedLora
from loraplex.adapters.kernels.lora_sgmv import SgmvLora
from loraplex.adapters.kernels.lora_torch import TorchLora
from loraplex.adapters.kernels.lora_triton import TritonLora
from loraplex.adapters.metadata import build_lora_meta
from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.layers.linear import Linear
from loraplex.platform.engine.lora import hooks as hooks_mod
from loraplex.platform.engine.lora.hooks import LoraHooks, choose_lora_backend

HAS_CC = bool(shutil.which("cc") or shutil.which("gcc"))
CPU = torch.device("cpu")
RANKS = [{"q_proj": 4, "v_proj": 4}, {"q_proj": 8, "o_proj": 8, "down_proj": 16}, {"up_proj": 5}]
LAYOUT = [(0, 5), (None, 2), (1, 1), (2, 3), (0, 1), (None, 1)]


def _step(dtype: torch.dtype = torch.float32):
    specs = llama_specs()
    pool = DevicePool(specs, capacity_bytes=4_000_000, max_lora_rank=16, dtype=dtype)
    adapters = [random_adapter(f"k{i}", r, seed=i, dtype=dtype) for i, r in enumerate(RANKS)]
    residents = [pool.load(a) for a in adapters]
    seqs = [(None if i is None else residents[i], n) for i, n in LAYOUT]
    per_token = [None if i is None else adapters[i] for i, n in LAYOUT for _ in range(n)]
    meta = build_lora_meta(seqs, max_loras=4, num_linears=len(specs), max_slices=3)
    return specs, pool, per_token, meta


def _backends() -> list[LoraBackend]:
    bounds = SliceBounds(llama_specs(), CPU)
    found: list[LoraBackend] = [TorchLora(), SgmvLora(), PackedLora()]
    return found + ([NativeLora(bounds)] if HAS_CC else [])


@pytest.mark.parametrize("backend", _backends(), ids=lambda b: b.name)
def test_each_backend_is_a_lora_backend_and_matches_the_oracle(backend):
    assert isinstance(backend, LoraBackend)
    specs, pool, per_token, meta = _step()
    torch.manual_seed(1)
    for lid, spec in enumerate(specs):
        x = torch.randn(len(per_token), spec.in_features)
        base = torch.randn(len(per_token), spec.out_features)
        y = base.clone()
        backend.delta(lid, x, y, meta, pool, spec)
        want = base.double() + reference_delta(x, per_token, spec)
        torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)


def test_triton_backend_is_a_lora_backend():
    """Its kernels run under TRITON_INTERPRET in test_lora_kernels_triton."""
    assert isinstance(TritonLora(SliceBounds(llama_specs(), CPU), 16), LoraBackend)


def test_the_choice_follows_device_dtype_and_mode():
    bounds = SliceBounds(llama_specs(), CPU)
    fp16 = choose_lora_backend(CPU, torch.float16, 16, bounds, fixed_order=False)
    assert isinstance(fp16, PackedLora)
    big_rank = choose_lora_backend(CPU, torch.float32, 4096, bounds, fixed_order=False)
    assert isinstance(big_rank, PackedLora)
    refused = choose_lora_backend(CPU, torch.float16, 16, bounds, fixed_order=True)
    specs, pool, per_token, meta = _step()
    x = torch.randn(len(per_token), specs[0].in_features)
    with pytest.raises(NotImplementedError, match="deterministic mode"):
        refused.delta(0, x, torch.zeros(x.shape[0], specs[0].out_features), meta, pool, specs[0])
    if HAS_CC:
        fp32 = choose_lora_backend(CPU, torch.float32, 16, bounds, fixed_order=False)
        assert isinstance(fp32, NativeLora)
        assert isinstance(choose_lora_backend(CPU, torch.float32, 16, bounds, fixed_order=True),
                          NativeLora)  # fmt: skip


def test_the_hooks_choose_once_at_build(monkeypatch):
    """After LoraHooks is built no delta asks which kernels exist (today's per-call if/elif
    asked in every Linear of every step)."""
    specs, pool, per_token, meta = _step()
    linears = [
        (
            Linear(s.in_features, s.out_features, bias=False, layer_idx=s.layer_idx,
                   name=s.slice_names[0], dtype=torch.float32, slice_names=s.slice_names,
                   slice_sizes=s.slice_sizes),
            s,
        )
        for s in specs
    ]  # fmt: skip
    hooks = LoraHooks(linears, lambda: pool, 16, CPU)
    chosen = hooks.backend
    assert isinstance(chosen, LoraBackend)

    def asked(*_args: object) -> bool:
        raise AssertionError("a delta asked which LoRA kernels are available")

    for mod, name in (
        (hooks_mod, "triton_lora_available"),
        (hooks_mod, "native_lora_available"),
        (lora_triton, "triton_lora_available"),
        (lora_cpu, "native_lora_available"),
    ):
        monkeypatch.setattr(mod, name, asked, raising=False)
    torch.manual_seed(2)
    with forward_context(ForwardContext(attn=None, lora=meta)):
        for module, spec in linears:
            x = torch.randn(len(per_token), spec.in_features)
            y = torch.zeros(len(per_token), spec.out_features)
            assert module.lora_delta is not None
            module.lora_delta(x, y, module)
            want = reference_delta(x, per_token, spec)
            torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    assert hooks.backend is chosen

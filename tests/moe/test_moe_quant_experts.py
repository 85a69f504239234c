"""Quantized expert stacks: the Triton grouped kernels read int8 / int4 / fp8 experts as the
torch path does (TRITON_INTERPRET=1, moe_triton_quant_cases.py), PyTorch's CPU int4 layout
gives the nibble layout's products, and expert parallelism over gloo (2 ranks, a rebalance
that migrates codes and scales midway) gives the single-rank quantized outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.triton_interpreter import run_cases_interpreted

from loraplex.loader.quant.schemes import resolve_scheme
from loraplex.loader.quant.weight_only import dequantize_fp8, dequantize_int8
from loraplex.moe.ep_launch import run_ep_group
from loraplex.moe.eplb import rebalance
from loraplex.moe.gating import GatingConfig
from loraplex.moe.layer import MoEBlock
from loraplex.moe.quant_experts import (
    DEQUANT_ROWS,
    QuantizedExperts,
    pack_nibbles,
    quantize_rows,
    to_cpu_int4_layout,
    unpack_nibbles,
)
from loraplex.moe.spec import MoESpec
from loraplex.moe.stats import ExpertLoadRecorder

HIDDEN, INTER, EXPERTS = 128, 128, 4
CHOICES = ("int8", "int4", "fp8")


def test_triton_quantized_experts_match_torch_under_interpreter():
    pytest.importorskip("triton")
    out = run_cases_interpreted(Path(__file__).with_name("moe_triton_quant_cases.py"), 600)
    assert "16 passed" in out


def test_nibbles_round_trip_and_cpu_int4_layout_gives_the_same_products():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 64, 256), generator=g, dtype=torch.uint8)
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)
    w = torch.randn(3, 128, 256, generator=g)
    codes, scale = quantize_rows("int4", w, 128, False, torch.float32)
    nibbles = QuantizedExperts("int4", codes, scale, 128)
    cpu = QuantizedExperts("int4", to_cpu_int4_layout(codes), scale, 128, cpu_int4=True)
    assert to_cpu_int4_layout(codes[:, :48]) is None  # rows not in blocks of 64: nibbles
    for rows in (3, DEQUANT_ROWS["int4"]):  # the packed kernel, then dequantize-and-matmul
        x = torch.randn(rows, 256, generator=g)
        for e in range(3):
            want = x @ nibbles.dequantize(e, torch.float32).t()
            assert torch.equal(
                cpu.dequantize(e, torch.float32), nibbles.dequantize(e, torch.float32)
            )
            torch.testing.assert_close(cpu.matmul(x, e), want, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(nibbles.matmul(x, e), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_kernel_and_dequantized_paths_agree(dtype):
    g = torch.Generator().manual_seed(1)
    codes, scale = quantize_rows("int8", torch.randn(2, 64, 128, generator=g), 0, True, dtype)
    q = QuantizedExperts("int8", codes, scale)
    ref = dequantize_int8(codes[1], scale[1], torch.float32)
    assert torch.equal(q.dequantize(1, dtype), ref.to(dtype))
    for rows in (1, DEQUANT_ROWS["int8"] + 1):
        x = torch.randn(rows, 128, generator=g).to(dtype)
        want = x.float() @ ref.t()
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        err = ((q.matmul(x, 1).float() - want).abs().max() / want.abs().max()).item()
        assert err < tol, (rows, err)


def _spec() -> MoESpec:
    return MoESpec(HIDDEN, INTER, EXPERTS, GatingConfig(top_k=2))


def _block(choice: str, ep=None) -> MoEBlock:
    g = torch.Generator().manual_seed(11)
    block = MoEBlock(_spec(), ep=ep, quant=resolve_scheme(choice))
    gate = torch.randn(EXPERTS, HIDDEN, generator=g) * 0.2
    gate[0] += 0.5  # a hot expert: the rebalance replicates it
    assert block.load_weight("gate.weight", gate)
    for e in range(EXPERTS):
        for name, shape in (
            ("w1", (INTER, HIDDEN)),
            ("w3", (INTER, HIDDEN)),
            ("w2", (HIDDEN, INTER)),
        ):
            w = torch.randn(*shape, generator=g) * 0.1
            assert block.load_weight(f"experts.{e}.{name}.weight", w)
    assert not block.missing_weights
    return block


def _run(blocks: dict[str, MoEBlock], on_step=None) -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    batches = [torch.randn(n, HIDDEN, generator=g) for n in (6, 3, 9)]
    outs: dict[str, list[torch.Tensor]] = {c: [] for c in blocks}
    with torch.no_grad():
        for step, x in enumerate(batches):
            for choice, block in blocks.items():
                outs[choice].append(block(x))
            if on_step is not None:
                on_step(step)
    return outs


def _ep_worker(ep):
    blocks = {c: _block(c, ep) for c in CHOICES}
    recorder = ExpertLoadRecorder(1, EXPERTS)
    blocks["int8"].load_recorder = recorder
    slots = {}

    def on_step(step: int) -> None:
        if step == 0:
            placement = rebalance(recorder.global_counts(ep)[0], ep.world_size, ep.world_size)
            for block in blocks.values():
                block.apply_placement(placement)
                assert block.w13_scale.shape[0] == block.w13.shape[0]
            slots["after"] = blocks["int4"].w13.shape[0]

    return _run(blocks, on_step), slots


def test_expert_parallel_serves_quantized_experts_across_a_migration():
    single = _run({c: _block(c) for c in CHOICES})
    results = run_ep_group(2, _ep_worker, backend="gloo")
    for rank, (outs, slots) in enumerate(results):
        assert slots["after"] == (EXPERTS + 2) // 2  # one redundant copy per rank
        for choice in CHOICES:
            for step, (got, want) in enumerate(zip(outs[choice], single[choice], strict=True)):
                torch.testing.assert_close(
                    got,
                    want,
                    atol=1e-4,
                    rtol=1e-4,
                    msg=lambda m, s=step, r=rank: f"rank {r} step {s}: {m}",
                )


@pytest.mark.parametrize("piece", ["weight_packed", "weight_scale", "qweight"])
def test_prequantized_expert_pieces_are_refused_clearly(piece):
    block = MoEBlock(_spec(), quant=resolve_scheme("int4"))
    with pytest.raises(NotImplementedError, match="pre-quantized MoE experts are not read yet"):
        block.load_weight(f"experts.0.w1.{piece}", torch.zeros(INTER, HIDDEN // 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_lookup_dequantize_is_the_formats_own(dtype):
    g = torch.Generator().manual_seed(2)
    codes, scale = quantize_rows("fp8", torch.randn(2, 64, 128, generator=g), 0, True, dtype)
    q = QuantizedExperts("fp8", codes, scale)
    assert torch.equal(q.dequantize(1, dtype), dequantize_fp8(codes[1], scale[1], dtype))

"""`loraplex bench moe` at tiny sizes: the grouped path (experts packed as a CPU engine packs
them) agrees with the gather loop, and every RESULT line is printed, decode and prefill."""

from __future__ import annotations

import re

import pytest
import torch

from loraplex.moe.packed_experts import can_pack_experts


def test_bench_moe_prints_grouped_ratios_at_decode_and_prefill(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from loraplex.platform.cli import main

    argv = ["bench", "moe", "--tokens", "64", "--decode-tokens", "4", "--hidden", "64",
            "--inter", "32", "--reps", "1", "--route-tokens", "256"]  # fmt: skip
    assert main(argv) == 0
    found = dict(re.findall(r"^RESULT moe\.([a-z0-9_]+)=(\S+)$", capsys.readouterr().out, re.M))
    want = {
        "grouped_over_naive", "grouped_over_masked_gather", "grouped_over_masked_gather_decode",
        "masked_gather_over_gemm_floor", "grouped_over_gemm_floor", "balancedness_before",
        "balancedness_after",
    }  # fmt: skip
    if can_pack_experts(torch.empty(1, 1, 1, dtype=torch.bfloat16)):
        want |= {"grouped_over_masked_gather_bf16", "grouped_over_masked_gather_bf16_decode",
                 "masked_gather_over_gemm_floor_bf16", "grouped_over_gemm_floor_bf16"}  # fmt: skip
    assert set(found) == want
    assert all(float(v) > 0 for v in found.values())


def test_bench_moe_thread_clock_needs_one_thread() -> None:
    """CPU seconds of one thread say nothing of a multi-threaded run: refused, not misread."""
    from loraplex.platform.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "moe", "--threads", "2"])

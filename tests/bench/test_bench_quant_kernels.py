"""`loraplex bench quant-kernels` at a tiny size on CPU: every path the CPU serves is timed
against bf16 and reported (PyTorch's packed int8/int4 kernels, fp8 weight-only and W8A8)."""

from __future__ import annotations

import re

import pytest


def test_every_cpu_path_is_timed_against_bf16(capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.platform.cli import main

    argv = ["--hidden", "256", "--intermediate", "384", "--batches", "1,3", "--iters", "2"]
    assert main(["bench", "quant-kernels", "--device", "cpu", *argv]) == 0
    found = dict(re.findall(r"^RESULT quant_kernels\.(\S+)=(\S+)$", capsys.readouterr().out, re.M))
    paths = ("int8_cpu_int8pack", "int4_cpu_int4pack", "fp8_weight_only", "fp8_scaled_mm")
    for shape in ("256x256_b1", "256x256_b3", "256x384_b1", "256x384_b3"):
        assert float(found[f"bf16_{shape}_ms"]) > 0
        for path in paths:
            assert float(found[f"{path}_{shape}_speedup"]) > 0
    assert len(found) == 4 * (1 + len(paths))

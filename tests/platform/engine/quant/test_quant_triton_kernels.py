"""The Triton W8A16 / W4A16 GEMMs equal the dequantize-then-matmul reference (TRITON_INTERPRET=1
on CPU; the cases are in quant_triton_cases.py, run in a fresh interpreter because Triton reads
the variable when the kernels are defined)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("triton")

from support.triton_interpreter import run_cases_interpreted  # noqa: E402


def test_triton_weight_only_gemms_under_the_interpreter() -> None:
    out = run_cases_interpreted(Path(__file__).with_name("quant_triton_cases.py"))
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 47, out[-2000:]

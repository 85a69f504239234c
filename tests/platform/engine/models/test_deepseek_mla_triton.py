"""The Triton MLA kernels (latent store, paged latent decode) equal the torch path under
TRITON_INTERPRET=1 (cases in mla_triton_cases.py, run in a fresh interpreter because Triton
reads the variable when the kernels are defined)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("triton")

from support.triton_interpreter import run_cases_interpreted  # noqa: E402


def test_mla_triton_kernels_under_the_interpreter() -> None:
    out = run_cases_interpreted(Path(__file__).with_name("mla_triton_cases.py"))
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) == 3, out[-2000:]

"""The Triton LoRA kernels under TRITON_INTERPRET=1 equal the torch path (CPU).

Triton reads TRITON_INTERPRET when its kernels are defined and other tests import them first,
so the cases (lora_triton_cases.py) run in a fresh interpreter with the variable set.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.triton_interpreter import run_cases_interpreted

pytest.importorskip("triton")


def test_triton_kernels_match_torch_under_interpreter():
    out = run_cases_interpreted(Path(__file__).with_name("lora_triton_cases.py"))
    assert "4 passed" in out

"""The Triton LoRA kernels under TRITON_INTERPRET=1 equal the torch path (CPU).

Triton reads TRITON_INTERPRET when its kernels are defined and other tests import them first,
so the cases (lora_triton_cases.py) run in a fresh interpreter with the variable set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_triton_kernels_match_torch_under_interpreter():
    cases = Path(__file__).with_name("lora_triton_cases.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases)],
        env=env,
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "4 passed" in out.stdout

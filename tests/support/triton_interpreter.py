"""Run a file of test cases in a fresh interpreter under TRITON_INTERPRET=1: Triton reads the
variable when its kernels are defined, and other test modules import them first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cases_interpreted(cases: Path, timeout: float = 300) -> str:
    """`pytest cases` with TRITON_INTERPRET=1; asserts it passed, returns its output."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases)],
        env=env,
        cwd=cases.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return out.stdout

"""The Triton grouped MoE kernels equal the torch expert path (TRITON_INTERPRET=1, CPU).

Triton reads TRITON_INTERPRET when its kernels are defined, and other tests may import
the kernels first, so the checks run in a fresh interpreter-mode subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TOLERANCE = {"prefill_fp16": 2e-2}


def test_triton_grouped_moe_matches_torch() -> None:
    script = Path(__file__).with_name("moe_triton_checks.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(errors) == {"decode_fp32", "prefill_fp32", "expert_map_fp32", "prefill_fp16"}
    for case, err in errors.items():
        assert err <= TOLERANCE.get(case, 1e-4), (case, err)

"""The Triton paged-KV kernels (store and decode attention) agree with the torch path.

Triton reads TRITON_INTERPRET when its kernels are defined, and other tests import the engine
(and so the kernels) first, so the checks run in a fresh interpreter-mode subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).parent
TOLERANCES = {
    "gqa_fp32": 1e-5,
    "mha_bs16": 1e-5,
    "mqa_dim24": 1e-5,
    "gqa_fp16": 2e-3,
    "store_kv": 0.0,
    "fp8_store_kv": 0.0,
    "fp8_decode": 1e-4,
    "fp8_store_kv_per_head": 0.0,
    "fp8_decode_per_head": 1e-4,
    "model_decode": 1e-4,
}


@pytest.fixture(scope="module")
def results() -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    tests_dir = str(HERE.parents[1])  # for `support`
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(HERE / "engine_triton_checks.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line[len("RESULTS ") :])


@pytest.mark.parametrize("case", sorted(TOLERANCES))
def test_triton_kernel_matches_torch(results, case):
    assert case in results
    assert results[case] <= TOLERANCES[case], f"{case}: max abs error {results[case]}"

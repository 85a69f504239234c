"""`loraplex bench gpu-check`: the list of checks, its refusal without CUDA, and its kernel
checks run for real at tiny sizes on CPU under TRITON_INTERPRET=1 (so the check code itself is
proven before the first GPU runs it at real sizes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

EXPECTED = {
    "paged_decode_bf16", "lora_bf16", "moe_bf16", "paged_decode_fp16", "lora_fp16", "moe_fp16",
    "w8a16_bf16", "w4a16_bf16", "w8a16_fp16", "w4a16_fp16",
    "cuda_tests", "graphs_vs_eager", "ep_nccl", "loader_pinned", "bench_graphs",
    "decode_bandwidth", "moe_quant_bf16", "moe_quant_fp16",
}  # fmt: skip


def test_dry_run_lists_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.bench.gpu_check import main

    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    names = set(re.findall(r"^([a-z0-9_]+): ", out, re.M))
    assert names == EXPECTED
    assert f"{len(EXPECTED)} checks" in out


def test_cli_name_with_a_dash_and_only_filter(capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.platform.cli import main

    assert main(["bench", "gpu-check", "--dry-run", "--only", "lora_fp16"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^([a-z0-9_]+): ", out, re.M) == ["lora_fp16"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_without_cuda_it_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.bench.gpu_check import main

    assert main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().out


def test_kernel_checks_pass_at_tiny_sizes_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    kernels = ("paged_decode_fp16", "lora_fp16", "moe_fp16", "w8a16_fp16", "w4a16_bf16")
    only = [arg for name in kernels for arg in ("--only", name)]
    cmd = [sys.executable, "-m", "loraplex.platform.cli", "bench", "gpu-check", "--tiny"]
    proc = subprocess.run(
        [*cmd, "--device", "cpu", *only], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    found = dict(re.findall(r"^RESULT (gpu_check\.[a-z0-9_]+)=(\S+)$", proc.stdout, re.M))
    for name in kernels:
        assert found[f"gpu_check.{name}_pass"] == "1"
    assert float(found["gpu_check.lora_fp16_rel_err"]) < 5e-3
    assert float(found["gpu_check.w8a16_fp16_rel_err"]) < 5e-3
    assert float(found["gpu_check.w4a16_bf16_rel_err"]) < 3e-2


def test_quantized_moe_check_passes_at_tiny_sizes_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "loraplex.platform.cli", "bench", "gpu-check", "--tiny"]
    proc = subprocess.run(
        [*cmd, "--device", "cpu", "--only", "moe_quant_fp16"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    found = dict(re.findall(r"^RESULT (gpu_check\.[a-z0-9_]+)=(\S+)$", proc.stdout, re.M))
    assert found["gpu_check.moe_quant_fp16_pass"] == "1"
    for kind in ("int8", "int4", "fp8"):
        assert float(found[f"gpu_check.moe_quant_{kind}_fp16_rel_err"]) < 5e-3


def test_the_cuda_test_files_it_runs_exist_in_the_checkout() -> None:
    from loraplex.bench._gpu_engine_checks import CUDA_TEST_FILES, LOADER_CUDA_TEST, REPO_ROOT

    files = [*CUDA_TEST_FILES, LOADER_CUDA_TEST.partition("::")[0]]
    assert [f for f in files if not (REPO_ROOT / f).is_file()] == []

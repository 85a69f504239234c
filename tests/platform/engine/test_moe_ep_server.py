"""`loraplex engine --model DIR --ep-size 2` as a real process: it spawns its follower rank,
serves `/generate`, and gives the same greedy tokens as a single-process engine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from moe_ep_workers import save_tiny_qwen2_moe
from replica_wire import body, generate

pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _single_process_tokens(model_dir: Path) -> list[list[int]]:
    from loraplex.platform.engine.config import EngineConfig
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.sampling_params import SamplingParams

    config = EngineConfig(model=model_dir, block_size=8, num_gpu_blocks=64, max_model_len=64)
    core = EngineCore(config)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    reqs = [core.add_request(p, params) for p in PROMPTS]
    while core.has_unfinished():
        core.step()
    return [list(r.output_token_ids) for r in reqs]


def test_engine_cli_with_ep_size_two_serves_like_one_rank(tmp_path: Path) -> None:
    model_dir = save_tiny_qwen2_moe(tmp_path / "qwen2moe")
    port = _free_port()
    argv = [sys.executable, "-m", "loraplex.platform.cli", "engine", "--model", str(model_dir),
            "--port", str(port), "--block-size", "8", "--num-gpu-blocks", "64",
            "--max-model-len", "64", "--max-loras", "0", "--ep-size", "2"]  # fmt: skip
    log = tmp_path / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, log.read_text()
            time.sleep(0.2)
        got = []
        for prompt in PROMPTS:
            req = body(prompt, max_tokens=6, temperature=0, ignore_eos=True)
            got.append(generate(base, req).token_ids)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert got == _single_process_tokens(model_dir)

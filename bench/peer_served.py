"""`loraplex bench peer --served`: the platform against `vllm serve --enable-lora`, both
served over HTTP, on one workload, one after the other.

The workload of issue 29: the demo model (`loraplex up`'s tiny Llama, with its tokenizer),
`--requests` concurrent `/v1/completions` (default 64) of token-id prompts of 16-61 tokens,
`--max-tokens` greedy tokens each (default 128, `ignore_eos` so every request runs to the end),
best of `--passes`, in the compute dtype our engine picks ("auto"), asked of both servers.
Configs: `base` (the base model), `mixed4` (4 adapters round-robin) and `mixed32` (32 distinct
adapters), rank-8 adapters on all seven projections, the same folders on both sides.

Ours: the whole platform as `bench serve` runs it (`serve_stack.local_stack`: embedded
PostgreSQL, SeaweedFS, Redis, a worker, the API and one replica), adapters uploaded and
validated through the tenant API. Theirs: `python -m vllm.entrypoints.openai.api_server` from
the peer venv (`LORAPLEX_PEER_VLLM_PYTHON`) with `--enable-lora` and every adapter as a
`--lora-modules` entry. RESULT lines: `peer.served.{vllm,loraplex}.<config>_tok_s` and
`peer.served.<config>_over_vllm` (target at least 2).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CONFIGS = ("base", "mixed4", "mixed32")
RANK = 8
SEVEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def prompts(requests: int, vocab: int, seed: int = 7) -> list[list[int]]:
    """`requests` token-id prompts of 16-61 tokens (ids clear of the special ones)."""
    rng = random.Random(seed)
    return [
        [rng.randrange(3, vocab) for _ in range(rng.randrange(16, 62))] for _ in range(requests)
    ]


def models_for(config: str, base: str, adapters: list[str], n: int) -> list[str]:
    """Each request's model name under `config`."""
    if config == "base":
        return [base] * n
    k = 4 if config == "mixed4" else 32
    return [adapters[i % k] for i in range(n)]


async def _one(http: httpx.AsyncClient, url: str, key: str | None, body: dict) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = await http.post(f"{url}/v1/completions", json=body, headers=headers)
    if r.status_code != 200:
        raise RuntimeError(f"{body['model']}: HTTP {r.status_code}: {r.text[:300]}")
    return int(r.json()["usage"]["completion_tokens"])


async def tok_s(
    url: str, key: str | None, names: list[str], ids: list[list[int]], max_tokens: int
) -> float:
    """Output tokens/s of one concurrent wave: every prompt at once, greedy, to the end."""
    limits = httpx.Limits(max_connections=len(ids) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as http:
        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(
            _one(http, url, key, {"model": m, "prompt": p, "max_tokens": max_tokens,
                                  "temperature": 0, "ignore_eos": True})
            for m, p in zip(names, ids, strict=True)
        ))  # fmt: skip
        return sum(tokens) / (time.perf_counter() - t0)


def measure(url: str, key: str | None, base: str, adapters: list[str], ids: list[list[int]],
            max_tokens: int, passes: int, side: str) -> dict[str, float]:  # fmt: skip
    """Best of `passes` per config (one warm-up wave first)."""
    asyncio.run(tok_s(url, key, models_for("mixed4", base, adapters, 8), ids[:8], 4))
    best: dict[str, float] = {}
    for p in range(passes):
        for config in CONFIGS:
            names = models_for(config, base, adapters, len(ids))
            value = asyncio.run(tok_s(url, key, names, ids, max_tokens))
            best[config] = max(best.get(config, 0.0), value)
            print(f"[{side}] pass {p + 1} {config}: {value:.0f} tok/s", file=sys.stderr, flush=True)
    return best


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_vllm_server(python: str, model: Path, adapters: dict[str, Path], dtype: str,
                    max_model_len: int, max_seqs: int, log: Path) -> tuple[str, subprocess.Popen]:  # fmt: skip
    """Start `vllm serve` from the peer venv; (its URL, the process) once /health answers."""
    port = _free_port()
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "base", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_seqs),
        "--enable-lora", "--max-loras", str(len(adapters)), "--max-lora-rank", str(RANK),
        "--lora-modules", *(f"{name}={path}" for name, path in adapters.items()),
    ]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    proc.kill()
    raise RuntimeError("vllm serve did not become healthy in 900 s")


def main(python: str | None, dtype_arg: str, requests: int, max_tokens: int, passes: int,
         ours_only: bool) -> int:  # fmt: skip
    """Run both sides and print RESULT lines."""
    from loraplex.bench._synthetic.adapters import write_random_adapter
    from loraplex.bench.serve_stack import local_stack, upload_and_wait
    from loraplex.platform.engine.compute_dtype import auto_compute_dtype

    dtype = auto_compute_dtype("cpu").name if dtype_arg == "auto" else dtype_arg
    weights = "auto" if dtype_arg == "auto" else {"float32": "fp32", "bfloat16": "bf16"}[dtype]
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lpx-peer-served-") as tmp_name:
        tmp = Path(tmp_name)
        with local_stack(0, weights=weights, max_loras=32,
                         engine_overrides={"max_num_seqs": max(requests, 64)}) as info:  # fmt: skip
            url, key = info[0], info[1]
            hf_config = json.loads((info.model_dir / "config.json").read_text())
            vocab = int(hf_config["vocab_size"])
            folders = {
                f"ad{i}": write_random_adapter(
                    tmp / f"ad{i}", hf_config, RANK, seed=100 + i, targets=SEVEN, std=0.05
                )  # fmt: skip
                for i in range(32)
            }
            for name, folder in folders.items():
                upload_and_wait(url, key, "demo", name, folder)
            ids = prompts(requests, vocab)
            names = list(folders)
            ours = measure(url, key, "demo", names, ids, max_tokens, passes, "loraplex")
            model_dir = info.model_dir
            if not ours_only and python:
                # Copy the model out: the stack's temp folder goes when it stops.
                shutil.copytree(model_dir, tmp / "model")
        results.update({f"peer.served.loraplex.{k}_tok_s": v for k, v in ours.items()})
        if not ours_only and python:
            max_len = max(len(p) for p in ids) + max_tokens + 16
            vurl, proc = run_vllm_server(python, tmp / "model", folders, dtype, max_len, requests,
                                         tmp / "vllm.log")  # fmt: skip
            try:
                theirs = measure(vurl, None, "base", names, ids, max_tokens, passes, "vllm")
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            results.update({f"peer.served.vllm.{k}_tok_s": v for k, v in theirs.items()})
            results.update({f"peer.served.{k}_over_vllm": ours[k] / theirs[k] for k in CONFIGS})
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}")
    return 0

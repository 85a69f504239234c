"""Engine-level checks of `loraplex bench gpu-check`: the CUDA-only tests, decode graphs vs
eager, expert parallelism over NCCL, the pinned loader path, `bench graphs`, and the decode
bandwidth of an 8B-shaped Llama. Each returns (passed, detail, {RESULT name: value}); a
check that cannot run here (one GPU for EP) returns passed None with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from loraplex.bench._gpu_kernel_checks import CheckContext

CheckResult = tuple[bool | None, str, dict[str, float]]

# The checkout the CUDA tests run from (bench/ is a top-level part).
REPO_ROOT = Path(__file__).resolve().parents[1]
# Tests that only run (or only mean something) on a CUDA device.
CUDA_TEST_FILES = (
    "tests/adapters/test_lora_kernels_triton_cuda.py",
    "tests/platform/engine/test_engine_cuda_graph.py",
    "tests/platform/engine/test_engine_decode_cuda_graph.py",
    "tests/platform/engine/test_engine_decode_graphs.py",
    "tests/platform/engine/test_engine_lora_decode_graphs.py",
    "tests/platform/engine/test_engine_cuda_graph_runner.py",
    "tests/platform/engine/quant/test_quant_triton_cuda.py",
)
LOADER_CUDA_TEST = "tests/loader/test_loader_stream.py::test_cuda_target"
LLAMA_8B = dict(
    hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
    vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
)  # fmt: skip


def _pytest(args: list[str], timeout_s: int = 420) -> CheckResult:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    try:
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout_s} s", {}
    tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|error|skipped)", tail[0])}
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    res = {f"gpu_check.tests_{k}": float(v) for k, v in counts.items()}
    return proc.returncode == 0, tail[0], res


def cuda_tests(ctx: CheckContext) -> CheckResult:
    """Every CUDA-only test file (pytest, natively on the device)."""
    return _pytest(list(CUDA_TEST_FILES))


def loader_pinned(ctx: CheckContext) -> CheckResult:
    """The streaming loader into pinned host slots and on to the device (S3 test, real server)."""
    ok, detail, _ = _pytest([LOADER_CUDA_TEST], timeout_s=240)
    return ok, detail, {}


def _small_llama(tmp: Path, arch: str = "llama") -> Path:
    from loraplex.bench._synthetic.models import save_random_model

    extra: dict[str, Any] = (
        dict(num_local_experts=4, num_experts_per_tok=2) if arch == "mixtral" else {}
    )
    save_random_model(
        tmp / arch, arch, seed=0, init="hf", tiny=False, vocab_size=512, hidden_size=256,
        intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
        **extra,
    )  # fmt: skip
    return tmp / arch


def _greedy(
    engine, prompts: list[list[int]], refs: list[str | None], tokens: int
) -> list[list[int]]:  # noqa: ANN001
    from loraplex.platform.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    reqs = [
        engine.add_request(p, sp, f"gc-{i}", r)
        for i, (p, r) in enumerate(zip(prompts, refs, strict=True))
    ]
    while engine.has_unfinished():
        engine.step()
    return [list(r.output_token_ids) for r in reqs]


def graphs_vs_eager(ctx: CheckContext) -> CheckResult:
    """Decode replayed from CUDA graphs vs the same engine with enforce_eager=True, greedy
    tokens equal, with and without adapters (fp32, so equal means equal)."""
    from loraplex.bench._synthetic.adapters import write_random_adapter
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.lora.runtime import LoraRuntime
    from loraplex.platform.engine_spec.config import EngineConfig

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        path = _small_llama(tmp)
        hf_config = json.loads((path / "config.json").read_text())
        dirs = [str(write_random_adapter(tmp / f"ad{i}", hf_config, 8, seed=i)) for i in range(3)]
        g = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(3, 512, (int(n),), generator=g).tolist() for n in (5, 17, 33, 9, 60, 2)
        ]
        results: dict[str, float] = {}
        details = []
        ok = True
        for lora in (False, True):
            refs = [(dirs + [None])[i % 4] if lora else None for i in range(len(prompts))]
            outs = []
            for eager in (False, True):
                cfg = EngineConfig(
                    model=str(path), device=ctx.device, dtype="float32", enforce_eager=eager,
                    max_num_seqs=8, num_gpu_blocks=256, max_model_len=256,
                    max_loras=4 if lora else 0, max_lora_rank=8,
                )  # fmt: skip
                core = EngineCore(cfg)
                if lora:
                    core.install_lora_runtime(LoraRuntime.for_engine(core))
                captured = bool(core.runner.decode_graphs) and (
                    not lora or core.runner.decode_graphs_have_lora
                )
                if not eager and not captured:
                    return False, f"no decode graphs captured (lora={lora})", {}
                outs.append(_greedy(core, prompts, refs, 24))
                del core
                torch.cuda.empty_cache()
            same = sum(a == b for a, b in zip(outs[0], outs[1], strict=True))
            tag = "lora" if lora else "base"
            results[f"gpu_check.graphs_vs_eager_{tag}_equal_seqs"] = float(same)
            details.append(f"{tag}: {same}/{len(prompts)} sequences equal")
            ok = ok and same == len(prompts)
    return ok, "; ".join(details), results


def ep_nccl(ctx: CheckContext) -> CheckResult:
    """Expert parallelism over NCCL on every GPU present vs one process, greedy tokens."""
    n = torch.cuda.device_count()
    if n < 2:
        return None, f"needs 2+ GPUs for NCCL ranks, found {n}", {}
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.ep_engine import start_ep_engine
    from loraplex.platform.engine_spec.config import EngineConfig

    with tempfile.TemporaryDirectory() as name:
        path = _small_llama(Path(name), "mixtral")
        cfg = EngineConfig(
            model=str(path), device="cuda", dtype="float32", max_num_seqs=4, num_gpu_blocks=128,
            max_model_len=128, max_loras=0, enforce_eager=True,
        )  # fmt: skip
        prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]
        want = _greedy(EngineCore(cfg), prompts, [None] * 3, 8)
        engine = start_ep_engine(cfg, n, backend="nccl")
        try:
            got = _greedy(engine, prompts, [None] * 3, 8)
        finally:
            engine.close()
    return got == want, f"{n} ranks, tokens {'equal' if got == want else 'DIFFER'}", {}


def bench_graphs(ctx: CheckContext) -> CheckResult:
    """`loraplex bench graphs` (graph replay faster than eager, with and without adapters)."""
    from loraplex.bench import graphs

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        graphs.main([])
    res = {
        f"gpu_check.{m[0]}": float(m[1])
        for m in re.findall(r"RESULT engine\.(\S+)=(\S+)", buf.getvalue())
    }
    speedup = res.get("gpu_check.graph_speedup", 0.0)
    return speedup >= 1.0, f"graph speedup {speedup:.2f}x", res


def device_bandwidth_gbs() -> tuple[float, str]:
    """Peak memory bandwidth (GB/s) from the device's clock and bus width, else a measured copy."""
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, "spec (clock x bus)"
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    from loraplex.bench._gpu_kernel_checks import timed_ms

    ms = timed_ms(lambda: dst.copy_(src), "cuda")
    return 2 * src.numel() / (ms / 1e3) / 1e9, "measured copy"


def _save_8b_shaped(path: Path, layers: int) -> int:
    """Random bf16 weights of a Llama-3-8B-shaped model, `layers` layers; returns weight bytes
    a decode step reads (every matrix but the embedding)."""
    from safetensors.torch import save_file

    c: dict[str, Any] = dict(LLAMA_8B, num_hidden_layers=layers, max_position_embeddings=4096)
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    path.mkdir(parents=True)
    cfg = dict(c, architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="bfloat16")
    (path / "config.json").write_text(json.dumps(cfg))
    read = 0

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda") * 0.02).to(torch.bfloat16).cpu()

    save_file({"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16), "lm_head.weight": rnd(v, h)}, str(path / "model-head.safetensors"))  # fmt: skip
    read += v * h * 2
    for layer in range(layers):
        p = f"model.layers.{layer}."
        shapes = {
            "self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h),
            "mlp.down_proj": (h, i),
        }  # fmt: skip
        t = {f"{p}{k}.weight": rnd(*s) for k, s in shapes.items()}
        t[f"{p}input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        t[f"{p}post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        save_file(t, str(path / f"model-{layer:03d}.safetensors"))
        read += sum(a * b for a, b in shapes.values()) * 2
    return read


def decode_bandwidth(ctx: CheckContext, layers: int = 32, context: int = 512) -> CheckResult:
    """Decode step of an 8B-shaped Llama (random bf16) at batch 1 and 64, graphs on: bytes
    read per step (weights + KV) over step time, as a fraction of device bandwidth (>= 0.7
    at batch 64)."""
    from loraplex.bench.graphs import measure

    peak, how = device_bandwidth_gbs()
    results = {"gpu_check.device_bandwidth_gbs": peak}
    with tempfile.TemporaryDirectory() as name:
        path = Path(name) / "llama8b"
        weights = _save_8b_shaped(path, layers)
        kv_per_token = layers * 2 * LLAMA_8B["num_key_value_heads"] * 128 * 2
        for b in (1, 64):
            args = argparse.Namespace(batch=b, context=context, iters=30, dtype="bfloat16", rank=16)
            graph_s, _ = measure(str(path), args)
            gbs = (weights + b * (context + 1) * kv_per_token) / graph_s / 1e9
            results[f"gpu_check.llama8b_b{b}_step_ms"] = graph_s * 1e3
            results[f"gpu_check.llama8b_b{b}_bandwidth_fraction"] = gbs / peak
            torch.cuda.empty_cache()
    frac = results["gpu_check.llama8b_b64_bandwidth_fraction"]
    return frac >= 0.7, f"b64 {frac:.0%} of {peak:.0f} GB/s ({how}), {layers} layers", results

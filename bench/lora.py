"""`loraplex bench lora`: batched multi-LoRA serving, measured against baselines in the same run.

Builds a random Llama with hidden size 2048 (TinyLlama's shape: 32 heads, 4 KV heads,
intermediate 5632; on CPU only `--layers` decoder layers, 2 by default, and a vocab of 8192)
and `--adapters` rank-16 adapters on all seven projections, then prints:

- lora.mixed32_over_base_step: decode step time (model forward + logits) of 32 tokens from 32
  distinct adapters over the same batch on the base model alone (the same static step with the
  LoRA metadata on / off, alternated; medians);
- lora.mixed32_ideal_ratio: the ratio bytes moved predict, (base weights + the 32 adapters'
  weights) / base weights, with base weights = every Linear plus the LM head (the embedding
  is a lookup); target: measured <= 1.15 x ideal;
- lora.over_one_by_one: output tok/s of one mixed batch over serving the same requests adapter
  by adapter (one `generate` per adapter);
- lora.over_peft: our output tok/s over peft's mixed-batch `generate(adapter_names=...)`;
- lora.cold_load_s: a cold adapter's time to first token from object storage (an embedded
  SeaweedFS S3 server; `--no-s3` reads a local directory instead and says so), next to the same
  request's time to first token with the adapter resident;
- lora.warm_swap_ms: copying an adapter from the host tier into device memory, next to one
  base decode step;
- lora.small_*: the peers' small-model reference workload (see `_lora_small.py`): our engine
  with 4 mixed adapters, base-only and LoRA-enabled-but-unused, against peft's mixed batch
  and HF `generate`, in tok/s, plus `small_mixed4_over_peft` and `small_mixed4_over_base`.

`--quick` shrinks everything to a seconds-long run (for tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from loraplex.bench._lora_small import GREEDY, SmallWorkload, run_small
from loraplex.bench._synthetic.adapters import peft_multi_adapter_model, write_random_adapter


def build_base(path: Path, layers: int, hidden: int, vocab: int):  # noqa: ANN201
    """Save a random Llama to `path`; returns the transformers model (for the peft baseline)."""
    from loraplex.bench._synthetic.models import save_random_model

    return save_random_model(
        path, "llama", seed=0, init="hf", tiny=False,
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 512), max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def add_all(core, prompts, refs, max_tokens: int, tag: str) -> list:  # noqa: ANN001
    """Queue one request per prompt on an EngineCore; returns the requests."""
    from loraplex.platform.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, **GREEDY)
    return [
        core.add_request(p, sp, f"{tag}-{i}", adapter=r)
        for i, (p, r) in enumerate(zip(prompts, refs, strict=True))
    ]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every 2-D weight a decode step reads (Linears + LM head, not the embedding)."""
    return sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if p.dim() == 2 and "embed_tokens" not in n
    )


def bench_torch_paths(rt, meta, b: int, repeats: int = 3) -> tuple[float, float]:  # noqa: ANN001
    """Seconds for one step's deltas on every hooked Linear: per-adapter loop vs gathered
    SGMV (its per-step plan built inside the timing, as the engine does)."""
    from loraplex.adapters.kernels.lora_sgmv import build_sgmv_plan, lora_delta_sgmv
    from loraplex.adapters.kernels.lora_torch import lora_delta_torch

    def sgmv(x, y, a, bb, meta, lid, offsets, sizes):  # noqa: ANN001, ANN202
        if lid == 0:
            meta.sgmv_plan = build_sgmv_plan(meta, a.shape[0], x.dtype)
        lora_delta_sgmv(x, y, a, bb, meta.sgmv_plan, lid, offsets, sizes)

    xs = [torch.randn(b, s.in_features, dtype=rt.tiers.dtype) for s in rt.tiers.specs]
    out = []
    for fn in (lora_delta_torch, sgmv):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for lid, spec in enumerate(rt.tiers.specs):
                y = torch.zeros(b, spec.out_features, dtype=rt.tiers.dtype)
                a, bb = rt.tiers.pool.a[lid], rt.tiers.pool.b[lid]
                fn(xs[lid], y, a, bb, meta, lid, spec.slice_offsets, spec.slice_sizes)
            best = min(best, time.perf_counter() - t0)
        out.append(best)
    return out[0], out[1]


def bench_mixed_step(llm, dirs, prompts, steps: int) -> tuple[float, float, float, tuple]:  # noqa: ANN001
    """(median LoRA step s, median base step s, ideal ratio, (loop s, sgmv s)) for a
    32-adapter decode batch.

    After prefilling the batch, the same static decode step (model forward + logits) runs with
    the step's LoRA metadata on and off, alternating each iteration, so both see the same
    inputs and the same share of a noisy machine.
    """
    core = llm.core
    runner, rt = core.runner, core.lora_runtime
    reqs = add_all(core, prompts, [str(d) for d in dirs], 4, "mixed")
    while any(r.num_output_tokens == 0 for r in reqs):
        core.step()
    b = len(reqs)
    runner.prepare_decode_inputs(reqs, b)
    meta = rt.prepare_step(reqs, [1] * b)
    lora_t: list[float] = []
    base_t: list[float] = []
    for _ in range(steps):
        for on, out in ((meta, lora_t), (None, base_t)):
            runner.lora_metadata = on
            t0 = time.perf_counter()
            runner.run_decode_step(b)
            out.append(time.perf_counter() - t0)
    paths = bench_torch_paths(rt, meta, b)
    for r in reqs:
        core.abort_request(r.request_id)
    while core.has_unfinished():
        core.step()
    base_bytes = weight_bytes(core.model)
    adapter_bytes = sum(
        rt.tiers.pool.get(r.adapter_key).nbytes for r in {r.adapter_key: r for r in reqs}.values()
    )
    return (
        statistics.median(lora_t),
        statistics.median(base_t),
        (base_bytes + adapter_bytes) / base_bytes,
        paths,
    )


def bench_mixed(llm, dirs, prompts, max_tokens: int) -> float:  # noqa: ANN001
    """Output tok/s of one mixed batch: every request with its own adapter."""
    from loraplex.platform.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, **GREEDY)
    t0 = time.perf_counter()
    llm.generate(prompts, sp, adapters=[str(d) for d in dirs])
    return max_tokens * len(prompts) / (time.perf_counter() - t0)


def bench_one_by_one(llm, dirs, prompts, max_tokens: int) -> float:  # noqa: ANN001
    """Output tok/s serving the same requests adapter by adapter (one generate each)."""
    from loraplex.platform.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, **GREEDY)
    t0 = time.perf_counter()
    for p, d in zip(prompts, dirs, strict=True):
        llm.generate([p], sp, adapters=[str(d)])
    return max_tokens * len(prompts) / (time.perf_counter() - t0)


def bench_peft(model, prompts, max_tokens: int) -> float:  # noqa: ANN001
    """peft's output tok/s for the same mixed batch via generate(adapter_names=...)."""
    ids = torch.tensor(prompts)
    names = [f"a{i}" for i in range(len(prompts))]
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            adapter_names=names,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
        )
        return max_tokens * len(prompts) / (time.perf_counter() - t0)


def ttft(core, prompt, ref, tag: str) -> float:  # noqa: ANN001
    """Seconds from submitting one request (engine idle) to its first token."""
    t0 = time.perf_counter()
    (req,) = add_all(core, [prompt], [ref], 1, tag)
    while req.num_output_tokens == 0:
        core.step()
    out = time.perf_counter() - t0
    while core.has_unfinished():
        core.step()
    return out


def bench_cold(llm, hf_config: dict, tmp: Path, prompt, use_s3: bool) -> tuple[float, float, str]:  # noqa: ANN001
    """(cold TTFT s, warm TTFT s, source) for an adapter never seen by the engine."""
    from loraplex.adapters.targets import resolve_config_targets
    from loraplex.platform.engine.lora import AdapterRef

    d = write_random_adapter(tmp / "cold-adapter", hf_config, 16, seed=999)
    core = llm.core
    if not use_s3:
        cold = ttft(core, prompt, str(d), "cold")  # local dir: read + validate + copy
        return cold, ttft(core, prompt, str(d), "warm"), "local directory (--no-s3)"
    from loraplex.loader.object_store import ObjectStore
    from loraplex.platform.embedded import EmbeddedSeaweedFS
    from loraplex.platform.object_keys import adapter_version_prefix
    from loraplex.platform.settings import Settings

    base = Settings()
    s3 = EmbeddedSeaweedFS(tmp / "s3", access_key=base.s3_access_key, secret_key=base.s3_secret_key)
    try:
        settings = Settings(s3_endpoint_url=s3.start(), s3_bucket="bench")
        store = ObjectStore(settings.storage())
        store.client.create_bucket(Bucket="bench")
        prefix = adapter_version_prefix("bench", "cold", 1)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            store.client.put_object(Bucket="bench", Key=prefix + name, Body=(d / name).read_bytes())
        weights = (d / "adapter_model.safetensors").read_bytes()
        core.lora_runtime.fetcher.object_store = store
        # What the validation job would store: the targets resolved once, on RE2.
        targets = resolve_config_targets((d / "adapter_config.json").read_bytes(), hf_config)
        ref = AdapterRef(
            object_prefix=prefix,
            sha256=hashlib.sha256(weights).hexdigest(),
            targets=targets.to_json(),
        )
        cold = ttft(core, prompt, ref, "cold")
        return cold, ttft(core, prompt, ref, "warm"), "embedded SeaweedFS S3"
    finally:
        s3.stop()


def bench_warm_swap(llm, repeats: int = 5) -> float:  # noqa: ANN001
    """Median ms to copy a host-tier adapter into device memory (evicted between tries)."""
    rt = llm.core.lora_runtime
    on_host = rt.host.keys()
    key = next(k for k in on_host if rt.tiers.pool.get(k) is None or rt.tiers.pool.get(k).refs == 0)
    times = []
    for _ in range(repeats):
        if key in rt.tiers.pool:
            rt.tiers.pool.evict(key)
        adapter = rt.host.get(key)
        t0 = time.perf_counter()
        rt.tiers.pool.load(adapter)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    """Run the multi-LoRA benchmarks and print RESULT lines."""
    from rich.console import Console

    ap = argparse.ArgumentParser(prog="loraplex bench lora", description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (CPU: keep it small)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--adapters", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12, help="timed decode steps (each: LoRA on, off)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (noise control)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--no-s3", action="store_true", help="cold load from a local dir instead")
    ap.add_argument("--skip-peft", action="store_true")
    ap.add_argument("--skip-small", action="store_true", help="skip the small-model workload")
    ap.add_argument("--only-small", action="store_true", help="run only the small-model workload")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for tests")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.hidden, args.vocab, args.adapters = 1, 128, 512, 4
        args.steps, args.rounds, args.max_tokens, args.no_s3 = 2, 1, 2, True
    console = Console()
    results: dict[str, float] = {}
    if not args.only_small:
        results.update(_main_workload(args, console))
    if not args.skip_small:
        w = SmallWorkload.quick() if args.quick else SmallWorkload()
        with tempfile.TemporaryDirectory() as tmp_name, console.status("small-model workload"):
            results.update(run_small(Path(tmp_name), w, args.skip_peft, console.print))
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}")
    return 0


def _main_workload(args: argparse.Namespace, console) -> dict[str, float]:  # noqa: ANN001
    """The TinyLlama-shaped workload: step ratio, batching, peft, cold load, swap."""
    from loraplex.platform.engine.llm import LLM

    n = args.adapters
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with console.status("building the base model and adapters"):
            hf = build_base(tmp / "base", args.layers, args.hidden, args.vocab)
            hf_config = json.loads((tmp / "base" / "config.json").read_text())
            dirs = [write_random_adapter(tmp / f"ad{i}", hf_config, 16, seed=i) for i in range(n)]
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, args.vocab, (15,), generator=g).tolist() for _ in range(n)]
        llm = LLM(
            str(tmp / "base"),
            max_loras=n,
            max_lora_rank=16,
            max_num_seqs=n,
            max_num_batched_tokens=1024,
            block_size=16,
        )
        with console.status("decode steps: 32 adapters vs base"):
            lora_s, base_s, ideal, (loop_s, bmm_s) = bench_mixed_step(
                llm, dirs, prompts, args.steps
            )
        console.print(
            f"{args.layers} layers, hidden {args.hidden}: step {lora_s * 1e3:.1f} ms with {n} "
            f"adapters, {base_s * 1e3:.1f} ms base; ideal ratio {ideal:.3f}"
        )
        console.print(
            f"torch path, all deltas of one step: per-adapter loop {loop_s * 1e3:.1f} ms, "
            f"gathered sgmv {bmm_s * 1e3:.1f} ms"
        )
        results["lora.mixed32_over_base_step"] = lora_s / base_s
        results["lora.mixed32_ideal_ratio"] = ideal
        # Interleaved, best of `--rounds` for the batch runs: the CPU is shared and noisy.
        pm = None if args.skip_peft else peft_multi_adapter_model(hf, dirs)
        mixed, peft_tps = 0.0, 0.0
        with console.status("mixed batch vs peft vs adapter by adapter"):
            for _ in range(max(1, args.rounds - 1)):
                mixed = max(mixed, bench_mixed(llm, dirs, prompts, args.max_tokens))
                if pm is not None:
                    peft_tps = max(peft_tps, bench_peft(pm, prompts, args.max_tokens))
            serial = bench_one_by_one(llm, dirs, prompts, args.max_tokens)
        console.print(f"mixed {mixed:.1f} tok/s, one adapter at a time {serial:.1f} tok/s")
        results["lora.over_one_by_one"] = mixed / serial
        if pm is not None:
            console.print(f"peft mixed batch (adapter_names) {peft_tps:.1f} tok/s")
            results["lora.over_peft"] = mixed / peft_tps
        with console.status("cold adapter load"):
            cold, warm, source = bench_cold(llm, hf_config, tmp, prompts[0], not args.no_s3)
        console.print(f"cold TTFT {cold:.3f} s from {source}; resident TTFT {warm:.3f} s")
        results["lora.cold_load_s"] = cold
        swap_ms = bench_warm_swap(llm)
        console.print(
            f"host->device swap {swap_ms:.2f} ms; one base decode step {base_s * 1e3:.1f} ms"
        )
        results["lora.warm_swap_ms"] = swap_ms
        runtime = llm.core.lora_runtime
        assert runtime is not None  # the LLM was built with LoRA on
        runtime.detach()
    ratio = results["lora.mixed32_over_base_step"] / results["lora.mixed32_ideal_ratio"]
    console.print(f"measured / ideal = {ratio:.3f} (target <= 1.15)")
    results["lora.torch_sgmv_over_loop"] = bmm_s / loop_s
    return results

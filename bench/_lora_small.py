"""The "small model" workload of `loraplex bench lora`: the peers' CPU reference, side by side.

The reference (docs REFERENCES.md, "Measured on these 2-core machines") is a 19M-parameter
Llama with hidden 256 and 4 layers served to 64 concurrent requests. With intermediate 688,
8 heads (MHA) and an *untied* vocab of 32,000, the parameter count is 19.55M (4 layers x
0.79M + 2 x 32,000 x 256 for embedding and LM head); a tied vocab of 32,000 would give 11.4M,
so the reference implies the untied one. The LM head (64 x 256 x 32,000 per decode step)
is by far the largest matmul of a step.

Everything runs in fp32: there is no fast bf16 CPU path here (the peers' numbers are bf16).
In one run, alternating the variants each pass (best pass kept; the machine is shared):
our engine with 4 mixed rank-16 adapters (all seven projections), our engine base-only,
our engine with LoRA enabled but unused, peft's mixed-batch `generate(adapter_names=...)`,
and HF `generate` on the base, all on the same prompts, greedy, fixed output length.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SMALL = dict(hidden=256, layers=4, intermediate=688, heads=8, vocab=32000)


GREEDY: dict[str, Any] = dict(temperature=0.0, ignore_eos=True)
"""Sampling of every bench request: greedy, exactly max_tokens long."""


@dataclass
class SmallWorkload:
    """Sizes of the workload; `quick()` shrinks it for tests."""

    requests: int = 64
    prompt_len: int = 128
    max_tokens: int = 128
    adapters: int = 4
    rank: int = 16
    passes: int = 2
    vocab: int = SMALL["vocab"]

    @classmethod
    def quick(cls) -> SmallWorkload:
        """A seconds-long version (same shapes per layer, fewer and shorter requests)."""
        return cls(requests=8, prompt_len=16, max_tokens=8, passes=1, vocab=1000)


def build_small_base(path: Path, vocab: int):  # noqa: ANN201
    """Save the small random Llama to `path`; returns the transformers model."""
    from loraplex.bench._synthetic.models import save_random_model

    return save_random_model(
        path, "llama", seed=0, init="hf", tiny=False,
        vocab_size=vocab, hidden_size=SMALL["hidden"], intermediate_size=SMALL["intermediate"],
        num_hidden_layers=SMALL["layers"], num_attention_heads=SMALL["heads"],
        num_key_value_heads=SMALL["heads"], max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def _engine_tps(llm, prompts, adapters, max_tokens: int) -> float:  # noqa: ANN001
    from loraplex.platform.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, **GREEDY)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, adapters=adapters)
    elapsed = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    if n != max_tokens * len(prompts):
        raise RuntimeError(f"expected {max_tokens * len(prompts)} output tokens, got {n}")
    return n / elapsed


def _hf_tps(model, prompts, max_tokens: int, names: list[str] | None) -> float:  # noqa: ANN001
    ids = torch.tensor(prompts)
    extra = {} if names is None else {"adapter_names": names}
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            **extra,
        )
        elapsed = time.perf_counter() - t0
    return (out.shape[1] - ids.shape[1]) * len(prompts) / elapsed


def run_small(
    tmp: Path, w: SmallWorkload, skip_hf: bool = False, progress: Callable[[str], None] = print
) -> dict[str, float]:
    """Run the workload; returns the `lora.small_*` results (tok/s and ratios)."""
    import transformers

    from loraplex.bench._synthetic.adapters import (
        peft_multi_adapter_model,
        write_random_adapter,
    )
    from loraplex.platform.engine.llm import LLM

    hf = build_small_base(tmp / "small", w.vocab)
    hf_config = json.loads((tmp / "small" / "config.json").read_text())
    params = sum(p.numel() for p in hf.parameters())
    dirs = [
        write_random_adapter(tmp / f"small-ad{i}", hf_config, w.rank, seed=100 + i)
        for i in range(w.adapters)
    ]
    g = torch.Generator().manual_seed(7)
    prompts = [
        torch.randint(3, w.vocab, (w.prompt_len,), generator=g).tolist() for _ in range(w.requests)
    ]
    mixed_refs = [str(dirs[i % len(dirs)]) for i in range(w.requests)]
    names = [f"a{i % len(dirs)}" for i in range(w.requests)]
    engine_args = dict(
        max_num_seqs=w.requests,
        max_num_batched_tokens=max(2048, w.requests),
        block_size=16,
        max_model_len=w.prompt_len + w.max_tokens + 16,
    )
    base_llm = LLM(str(tmp / "small"), **engine_args)
    lora_llm = LLM(str(tmp / "small"), max_loras=w.adapters, max_lora_rank=w.rank, **engine_args)
    variants: dict[str, Callable[[], float]] = {
        "mixed4": lambda: _engine_tps(lora_llm, prompts, mixed_refs, w.max_tokens),
        "base": lambda: _engine_tps(base_llm, prompts, None, w.max_tokens),
        "lora_unused": lambda: _engine_tps(lora_llm, prompts, None, w.max_tokens),
    }
    if not skip_hf:
        hf_base = transformers.LlamaForCausalLM.from_pretrained(tmp / "small").float().eval()
        pm = peft_multi_adapter_model(hf, dirs)
        variants["peft_mixed4"] = lambda: _hf_tps(pm, prompts, w.max_tokens, names)
        variants["hf_base"] = lambda: _hf_tps(hf_base, prompts, w.max_tokens, None)
    progress(
        f"small model: {params / 1e6:.2f}M params (hidden 256, 4 layers, vocab {w.vocab} "
        f"untied), fp32, {w.requests} requests x {w.prompt_len} prompt + {w.max_tokens} out, "
        f"{w.adapters} adapters rank {w.rank}; {torch.get_num_threads()} torch threads"
    )
    # a short warm-up of each engine variant (first-step allocations, adapter loads)
    _engine_tps(lora_llm, prompts[:4], mixed_refs[:4], 2)
    _engine_tps(base_llm, prompts[:4], None, 2)
    best = dict.fromkeys(variants, 0.0)
    for p in range(w.passes):
        order = list(variants) if p % 2 == 0 else list(reversed(variants))
        for name in order:
            best[name] = max(best[name], variants[name]())
        summary = ", ".join(f"{k} {v:.0f}" for k, v in best.items())
        progress(f"pass {p + 1}: {summary}")
    runtime = lora_llm.core.lora_runtime
    assert runtime is not None  # the LLM was built with LoRA on
    runtime.detach()
    res = {f"lora.small_{k}_tps": v for k, v in best.items()}
    res["lora.small_mixed4_over_base"] = best["mixed4"] / best["base"]
    if "peft_mixed4" in best:
        res["lora.small_mixed4_over_peft"] = best["mixed4"] / best["peft_mixed4"]
    return res

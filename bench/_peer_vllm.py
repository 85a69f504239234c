"""The vLLM side of `loraplex bench peer`, run by the peer venv's Python as a plain script.

Imports only the standard library and vllm (the peer venv has no loraplex). Reads a JSON spec
(model folder, token-id prompts, adapter folders, configs, passes, dtype) from argv[1], runs
each config through `vllm.LLM.generate` best of `passes`, and prints one line
`PEER_RESULT {json}` with output tok/s per config. Progress goes to stderr.
"""

from __future__ import annotations

import gc
import json
import sys
import time


def log(msg: str) -> None:
    """Progress on stderr (stdout carries the result line)."""
    print(f"[vllm] {msg}", file=sys.stderr, flush=True)


def engine(spec: dict, lora: bool):  # noqa: ANN201
    """A vLLM engine over the spec's model, with LoRA enabled when asked."""
    from vllm import LLM

    extra = {}
    if lora:
        extra = dict(enable_lora=True, max_loras=spec["max_loras"], max_lora_rank=spec["rank"])
    return LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        skip_tokenizer_init=True,
        max_model_len=spec["max_model_len"],
        max_num_seqs=len(spec["prompts"]),
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        seed=0,
        **extra,
    )


def tok_s(llm, spec: dict, adapters: list[str | None]) -> float:  # noqa: ANN001
    """Output tokens per second of one generate over every prompt (adapter per prompt)."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    sp = SamplingParams(
        temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True, detokenize=False
    )
    ids = {p: i + 1 for i, p in enumerate(spec["adapters"])}
    reqs = [None if a is None else LoRARequest(f"a{ids[a]}", ids[a], a) for a in adapters]
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, lora_request=reqs, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    want = spec["max_tokens"] * len(prompts)
    if n != want:
        raise RuntimeError(f"vllm produced {n} tokens, expected {want}")
    return n / elapsed


def main() -> int:
    """Run every config of the spec and print the PEER_RESULT line."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    configs: dict[str, list[str | None]] = spec["configs"]
    out: dict[str, float] = {}
    for lora in (False, True):
        names = [n for n, refs in configs.items() if (n != "base") == lora]
        if not names:
            continue
        log(f"starting an engine (LoRA {'on' if lora else 'off'})")
        llm = engine(spec, lora)
        for name in names:  # warm-up: first-step allocations, adapter loads
            tok_s(llm, {**spec, "max_tokens": 2}, configs[name])
        for p in range(spec["passes"]):
            for name in names:
                out[name] = max(out.get(name, 0.0), tok_s(llm, spec, configs[name]))
            log(f"pass {p + 1}: " + ", ".join(f"{k} {v:.0f}" for k, v in out.items()))
        del llm
        gc.collect()
    print("PEER_RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

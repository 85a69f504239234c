"""The offline baseline of `loraplex bench serve`: the same engine options as the served
replica, the same prompts (rendered with the model's chat template, as the gateway renders
them) and output lengths, all submitted at once to an in-process engine; output tokens/s."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine_spec.config import EngineConfig


def offline_output_tps(
    config: EngineConfig,
    model_dir: Path,
    prompts: list[str],
    output_tokens: list[int],
    adapters: list[str | None] | None = None,
) -> float:
    """Output tokens/s of `prompts` (chat messages) run offline, each for exactly the tokens
    the served run produced for it (on its adapter folder, when `adapters` names one), with
    the served replica's engine options."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    fields.pop("model", None)
    llm = LLM(str(model_dir), **fields)
    tok = llm.get_tokenizer()
    ids = [
        tok.encode(
            tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True),
            add_special_tokens=False,
        )
        for p in prompts
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=max(n, 1), min_tokens=max(n, 1))
        for n in output_tokens
    ]
    first = None if adapters is None else [adapters[0]]
    llm.generate([ids[0]], [params[0]], adapters=first)  # warm-up (kernels built, caches touched)
    began = time.perf_counter()
    outputs = llm.generate(ids, params, adapters=adapters)
    wall = time.perf_counter() - began
    return sum(len(o.outputs[0].token_ids) for o in outputs) / wall

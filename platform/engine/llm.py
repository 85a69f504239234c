"""LLM: the offline Python API, `LLM(model=PATH).generate(prompts, sampling_params)`."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, cast

from loraplex.platform.engine.engine_core import EngineCore
from loraplex.platform.engine.outputs import CompletionOutput, RequestOutput
from loraplex.platform.engine.ports import LoraRuntimeProtocol
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine_spec.config import EngineConfig

Prompt = str | list[int]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
        return [cast(list[int], prompts)]  # one prompt given as token ids
    if not isinstance(prompts, list | tuple):
        raise TypeError("prompts must be a string, a list of token ids, or a list of those")
    return list(cast(Sequence[Prompt], prompts))  # not token ids (above): a list of prompts


def _per_prompt(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
        return list(value)
    return [value] * n


class LLM:
    """Runs an EngineCore to completion over a batch of prompts (continuous batching inside)."""

    def __init__(self, model: str, **engine_args: Any) -> None:
        # Multi-LoRA follows EngineConfig's one default, as the server does: on unless
        # max_loras=0 (sized by max_loras / max_lora_rank / adapter_memory bytes).
        if "adapter_memory" in engine_args:
            engine_args["adapter_memory_bytes"] = engine_args.pop("adapter_memory")
        self.config = EngineConfig(model=model, **engine_args)
        self.core = EngineCore(self.config)
        self._calls = itertools.count()
        if self.config.serves_adapters:
            from loraplex.platform.engine.lora.runtime import LoraRuntime

            self._install_lora_runtime(LoraRuntime.for_engine(self.core))

    def _install_lora_runtime(self, runtime: LoraRuntimeProtocol) -> None:
        """Hook for the multi-LoRA runtime; see `EngineCore.install_lora_runtime`."""
        self.core.install_lora_runtime(runtime)

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (None when the folder has no tokenizer.json)."""
        return self.core.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        adapters: list[Any | None] | None = None,
        cache_salt: str | list[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; one RequestOutput per prompt, in order.

        `adapters` holds one adapter reference (or None for the base model) per prompt.
        """
        plist = _as_prompt_list(prompts)
        params = _per_prompt(sampling_params or SamplingParams(), len(plist), "sampling_params")
        adapter_refs = _per_prompt(adapters, len(plist), "adapters")
        salts = _per_prompt(cache_salt, len(plist), "cache_salt")
        if any(a is not None for a in adapter_refs) and self.core.lora_runtime is None:
            raise NotImplementedError("multi-LoRA runtime not available")
        subs: dict[str, tuple[int, int]] = {}
        results: list[RequestOutput] = []
        call = next(self._calls)
        try:
            for i, (prompt, sp) in enumerate(zip(plist, params, strict=True)):
                first = None
                for k in range(sp.n):
                    one = dataclasses.replace(
                        sp, n=1, seed=None if sp.seed is None else sp.seed + k
                    )
                    rid = f"llm-{call}-{i}-{k}"
                    req = self.core.add_request(prompt, one, rid, adapter_refs[i], salts[i])
                    subs[rid] = (i, k)
                    first = first or req
                assert first is not None  # sp.n >= 1 (SamplingParams checks it)
                results.append(
                    RequestOutput(
                        str(i),
                        prompt if isinstance(prompt, str) else None,
                        list(first.prompt_token_ids),
                        None,
                        [CompletionOutput(k, "", [], None, None) for k in range(sp.n)],
                    )
                )
            self._run(subs, results, params)
        except BaseException:
            for rid in subs:
                self.core.abort_request(rid)
            while self.core.has_unfinished():
                self.core.step()
            raise
        return results

    def _run(
        self,
        subs: dict[str, tuple[int, int]],
        results: list[RequestOutput],
        params: list[SamplingParams],
    ) -> None:
        pending = set(subs)
        while pending:
            for d in self.core.step():
                if d.request_id not in subs:
                    continue
                i, k = subs[d.request_id]
                res, comp = results[i], results[i].outputs[k]
                comp.token_ids.extend(d.new_token_ids)
                comp.text += d.new_text
                if params[i].logprobs is not None:
                    comp.logprobs = (comp.logprobs or []) + d.new_logprobs
                if d.prompt_logprobs is not None and k == 0:
                    res.prompt_logprobs = d.prompt_logprobs
                res.num_cached_tokens = max(res.num_cached_tokens, d.num_cached_tokens)
                if d.finished:
                    comp.finish_reason = d.finish_reason
                    pending.discard(d.request_id)

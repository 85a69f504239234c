"""EngineCore: one engine replica's loop body: add/abort requests, step, report deltas.

Owns the model runner, the scheduler with its KV cache manager, the detokenizers and the
metrics. Not thread-safe: one thread (the server's engine loop, or `LLM.generate`) drives it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from loraplex.loader.timeline import Timeline
from loraplex.platform.engine.batch_invariant import (
    DeterministicModeUnsupported,
    make_batch_invariant,
)
from loraplex.platform.engine.block_pool import BlockPool
from loraplex.platform.engine.cold_start import finish_cold_start
from loraplex.platform.engine.decode_graphs import recapture_decode_graphs, setup_decode_graphs
from loraplex.platform.engine.kv_cache import kv_cache_bytes_per_block, kv_cache_torch_dtype
from loraplex.platform.engine.metrics import EngineMetrics
from loraplex.platform.engine.model_runner import ModelRunner, ModelRunnerOutput
from loraplex.platform.engine.model_source import load_engine_model
from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.ports import LoraRuntimeProtocol
from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request, RequestStatus
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.scheduler import Scheduler, SchedulerOutput
from loraplex.platform.engine.speculative.config import SpecConfig
from loraplex.platform.engine.speculative.draft_model import DraftModel
from loraplex.platform.engine.speculative.report import AcceptanceCollector, speculative_state
from loraplex.platform.engine.speculative.speculator import Speculator
from loraplex.platform.engine.structured.bitmask import MaskFiller
from loraplex.platform.engine.structured.compiler import GrammarCompiler
from loraplex.platform.engine.structured.state import GrammarError, GrammarState
from loraplex.platform.engine.weight_quantization import model_weight_bytes
from loraplex.platform.engine_spec.config import EngineConfig
from loraplex.platform.engine_spec.speculative import parse_speculative
from loraplex.platform.tokenizing import IncrementalDetokenizer
from loraplex.platform.wire import WIRE_VERSION, ColdStartPhase, ReplicaState

log = logging.getLogger(__name__)


class EngineCore:
    """Continuous-batching engine over one base model (and, once installed, a LoRA runtime).

    `before_forward`, if given, sees each step's batch before the forward runs (the
    expert-parallel leader sends it to its follower ranks there).
    """

    def __init__(
        self,
        config: EngineConfig,
        before_forward: Callable[[SchedulerOutput], None] | None = None,
    ) -> None:
        self.config = config
        self.before_forward = before_forward
        if config.cpu_threads is not None and torch.device(config.device).type == "cpu":
            torch.set_num_threads(config.cpu_threads)  # process-wide: one engine per process
        # Cold start: model (local folder or streamed from s3://), KV cache, decode graphs.
        self.timeline = Timeline(config.model_id or config.model)
        loaded = load_engine_model(config, self.timeline)
        hf_config = loaded.hf_config
        self.model_id = loaded.model_id
        self.dtype = loaded.dtype
        self.dtype_reason = loaded.dtype_reason  # why this compute dtype (reported in /state)
        self.model = loaded.model
        if config.deterministic:  # batch-invariant kernels, or a refusal naming what is missing
            why = config.deterministic_refusal(hf_config)  # the architecture (MLA), before kernels
            if why is not None:
                raise DeterministicModeUnsupported(
                    f"the deterministic mode does not cover {why} yet"
                )
            make_batch_invariant(self.model, config, hf_config, self.dtype)
        self.tokenizer = loaded.tokenizer
        eos = self.tokenizer.eos_token_ids if self.tokenizer is not None else []
        if not eos:
            value = hf_config.get("eos_token_id")
            eos = value if isinstance(value, list) else [value] if isinstance(value, int) else []
        self.eos_token_ids = frozenset(eos)
        self.vocab_size = int(hf_config["vocab_size"])
        config.check_model_len(int(hf_config.get("max_position_embeddings", 2048)))
        max_len = int(config.max_model_len)  # type: ignore[arg-type]  # check_model_len set it
        self.kv_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, self.dtype)
        num_blocks = self._num_blocks(max_len)
        self.pool = BlockPool(num_blocks, config.enable_prefix_caching)
        self.kv = KVCacheManager(
            self.pool, config.block_size, self.model_id, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.kv,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            max_len,
            config.enable_chunked_prefill,
            shared_prefill_s=config.shared_prefill_s,
        )
        self.runner = ModelRunner(
            self.model,
            num_blocks,
            config.block_size,
            config.max_num_seqs,
            max_len,
            self.kv_dtype,
            config.device,
            config.seed,
        )
        self.runner.mask_filler = MaskFiller(self.vocab_size)
        self.grammars: GrammarCompiler | None = None  # built on the first constrained request
        self.metrics = EngineMetrics(loaded.name)
        self.weight_quantization = loaded.weight_quantization
        self.weight_bytes = model_weight_bytes(self.model)
        self.kv_cache_bytes = sum(t.numel() * t.element_size() for t in self.runner.kv_caches)
        self.metrics.set_memory(
            self.weight_bytes,
            self.weight_quantization,
            self.kv_cache_bytes,
            "fp8" if config.kv_cache_dtype == "fp8" else str(self.kv_dtype).removeprefix("torch."),
            num_blocks,
        )
        self.decode_graphs = setup_decode_graphs(self.runner, config, self.timeline)
        finish_cold_start(self.timeline, self.metrics.registry, loaded.name)
        self.lora_runtime: LoraRuntimeProtocol | None = None
        self.speculator: Speculator | None = None
        self.metrics.registry.register(AcceptanceCollector(lambda: self.speculator, loaded.name))
        if config.speculative is not None:  # the deployment's option: speculate from the start
            self.enable_speculation(SpecConfig.from_option(parse_speculative(config.speculative)))
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._aborted: list[Request] = []
        self.last_num_scheduled_tokens = 0
        self._ids = itertools.count()

    def _num_blocks(self, max_len: int) -> int:
        cfg = self.config
        per_seq = -(-max_len // cfg.block_size)
        if cfg.num_gpu_blocks is not None:
            n = cfg.num_gpu_blocks
        else:
            per_block = kv_cache_bytes_per_block(self.model, cfg.block_size, self.kv_dtype)
            budget = cfg.kv_cache_memory_bytes
            if budget is None and torch.device(cfg.device).type == "cuda":
                free, _ = torch.cuda.mem_get_info(torch.device(cfg.device))
                budget = int(free * cfg.gpu_memory_utilization)
            if budget is None:
                n = min(cfg.cpu_kv_cache_bytes // per_block, 2 * cfg.max_num_seqs * per_seq)
            else:
                n = budget // per_block
        if n < per_seq:
            raise ValueError(
                f"the KV cache holds {n} blocks of {cfg.block_size} tokens, fewer than one "
                f"max_model_len={max_len} sequence needs ({per_seq}); give it more memory"
            )
        return int(n)

    # -- requests ------------------------------------------------------------------------

    def install_lora_runtime(self, runtime: LoraRuntimeProtocol) -> None:
        """Plug in the multi-LoRA runtime (`ports.LoraRuntimeProtocol`): it resolves adapter
        references, builds each step's LoRA metadata, and its admission policy gates the
        scheduler."""
        budget = self.config.expert_lora_memory_bytes
        if budget is not None:  # the config's expert-LoRA byte budget over the runtime's default
            experts = getattr(runtime, "experts", None)
            if experts is None:
                raise ValueError(
                    f"expert_lora_memory_bytes is set but {self.model_id} has no MoE experts"
                )
            experts.capacity_bytes = budget
        # the config's starvation bound over the runtime's (one default: EngineConfig's)
        policy = runtime.admission_policy
        if hasattr(policy, "max_wait_steps"):
            policy.max_wait_steps = self.config.lora_max_wait_steps
        self.lora_runtime = runtime
        self.runner.lora_runtime = runtime
        if self.decode_graphs is not None:  # recapture so adapter decode steps replay too
            self.decode_graphs = recapture_decode_graphs(self.runner, self.config, self.timeline)
        self.scheduler.policy = runtime.admission_policy

    def enable_speculation(self, spec: SpecConfig | None) -> None:
        """Turn speculative decoding on with `spec` (None: off) for the steps to come."""
        if spec is None:
            self.speculator = None
            return
        cfg = self.config
        max_len = int(cfg.max_model_len)  # type: ignore[arg-type]  # set at build (check_model_len)
        drafter = None
        if spec.draft_model is not None:  # method draft_model or draft_adapter
            drafter = DraftModel.load(
                spec.draft_model,
                self.vocab_size,
                block_size=cfg.block_size,
                max_model_len=max_len,
                dtype=str(self.dtype).removeprefix("torch."),
                device=cfg.device,
                seed=cfg.seed,
                storage=cfg.storage,
            )
            if spec.method == "draft_adapter":
                drafter.enable_adapters(max(1, cfg.max_loras), cfg.max_lora_rank)
        self.speculator = Speculator(
            spec,
            self.kv,
            cfg.max_num_batched_tokens,
            max_len,
            drafter,
            self.runner.sampler,
        )

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        adapter: Any | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """Queue a prompt (text or token ids); `adapter` is a reference the LoRA runtime resolves."""
        params = params or SamplingParams()
        if params.n != 1:
            raise ValueError("EngineCore takes n=1 requests; LLM fans out n>1 itself")
        ids = self._tokenize(prompt)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model folder has none")
        adapter_key, handle = None, None
        if adapter is not None:
            if self.lora_runtime is None:
                raise NotImplementedError("multi-LoRA runtime not available")
            adapter_key, handle = self.lora_runtime.resolve_adapter(adapter)
            if self.speculator is not None:  # the draft adapter tied to it, if the ref has one
                self.speculator.tie_drafts(adapter_key, adapter)
        grammar = self._grammar_state(params)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        request = Request(
            rid,
            ids,
            params,
            self.eos_token_ids,
            adapter_key=adapter_key,
            adapter=handle,
            cache_salt=cache_salt,
            grammar=grammar,
        )
        self.scheduler.add_request(request)
        if self.tokenizer is not None:
            self._detok[rid] = IncrementalDetokenizer(
                self.tokenizer,
                ids,
                list(params.stop),  # type: ignore[arg-type]  # a list since SamplingParams.__post_init__
                params.include_stop_str_in_output,
                params.skip_special_tokens,
            )
        return request

    def _grammar_state(self, params: SamplingParams) -> GrammarState | None:
        """The request's matcher for its structured-output constraint (compiled once per
        content); checks `logit_bias` ids against the vocabulary. ValueError on bad input."""
        bad = [t for t in params.logit_bias or {} if t >= self.vocab_size]
        if bad:
            raise ValueError(f"logit_bias token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        if params.structured is None:
            return None
        if self.tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer.json")
        if self.grammars is None:
            self.grammars = GrammarCompiler(
                self.tokenizer.tokenizer.to_str(), self.vocab_size, sorted(self.eos_token_ids)
            )
        return self.grammars.state_for(params.structured)

    def _tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer.json; pass prompt token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return ids

    def warm_adapter(self, ref: Any) -> str:
        """Fetch an adapter version into the host tier ahead of its first request."""
        if self.lora_runtime is None:
            raise ValueError("this engine serves no adapters (no LoRA runtime)")
        return self.lora_runtime.warm(ref)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; its final delta comes with the next step."""
        request = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        if request is None:
            return False
        self._aborted.append(request)
        return True

    def computed_prompt_tokens(self, request_id: str) -> int | None:
        """Prompt tokens computed so far for a live request, prefix-cache hits excluded (what a
        client that leaves before its first token is metered for); None when unknown."""
        r = self.scheduler.requests.get(request_id)
        if r is None:
            return None
        return max(0, min(r.num_computed_tokens, r.num_prompt_tokens) - r.num_cached_tokens)

    def has_unfinished(self) -> bool:
        """True while requests wait or run, or an abort has not been reported yet."""
        return self.scheduler.has_unfinished() or bool(self._aborted)

    # -- one step ------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        """Schedule, run one forward, sample, and return what changed for each request."""
        step_start = time.perf_counter()
        if self.lora_runtime is not None:
            for rid in self.lora_runtime.take_failed_request_ids():
                self.abort_request(rid)  # its adapter failed to load (the runtime logged why)
        deltas = [self._final_delta(r, [], []) for r in self._aborted]
        self._aborted = []
        sched = self.scheduler.schedule()
        self.last_num_scheduled_tokens = sched.num_tokens
        if sched.is_empty:
            self._update_gauges()
            return deltas
        prev_times = {s.request.request_id: s.request.last_token_time for s in sched.scheduled}
        before = {s.request.request_id: s.request.num_output_tokens for s in sched.scheduled}
        spec = self.speculator
        drafted = spec.plan(sched) if spec is not None else 0
        if self.before_forward is not None:
            self.before_forward(sched)
        result = self.runner.execute(sched)
        self.scheduler.observe_step(sched, time.perf_counter() - step_start)
        for rid, entries in result.prompt_logprobs.items():
            self.scheduler.requests[rid].prompt_logprobs.extend(entries)
        finished = {
            r.request_id for r in self.scheduler.update(sched, result.sampled, result.accepted)
        }
        emitted = self._emitted(result) if spec is not None else {}
        if spec is not None and drafted:  # no drafts this step: nothing to settle
            spec.settle(sched, emitted)
        now = time.monotonic()
        for s in sched.scheduled:
            r = s.request
            if result.sampled.get(r.request_id) is None:
                continue
            tokens = r.output_token_ids[before[r.request_id] :]
            lps = self._step_logprobs(r.request_id, result)[: len(tokens)]
            r.logprobs.extend(lps)
            kept: list[int] = []
            for token in tokens:
                kept.append(token)
                self._advance_grammar(r, token, finished)
                detok = self._detok.get(r.request_id)
                if detok is not None and detok.add(token) and r.request_id not in finished:
                    self.scheduler.finish_request(r.request_id, RequestStatus.FINISHED_STOPPED)
                    break
                if detok is not None and detok.stopped:
                    r.status = RequestStatus.FINISHED_STOPPED
                    break
            self._observe_tokens(r, len(kept), prev_times[r.request_id], now)
            deltas.append(self._delta(r, kept, lps[: len(kept)]))
        self._update_gauges()
        if spec is not None:
            num_emitted = sum(len(t) for t in emitted.values())
            spec.end_step(sched, drafted, num_emitted, time.perf_counter() - step_start)
        return deltas

    @staticmethod
    def _emitted(result: ModelRunnerOutput) -> dict[str, list[int]]:
        """Per drafting request, every token its verification emitted (sampled + accepted)."""
        out: dict[str, list[int]] = {}
        for rid, token in result.sampled.items():
            if token is not None:
                out[rid] = [token, *result.accepted.get(rid, [])]
        return out

    @staticmethod
    def _step_logprobs(rid: str, result: ModelRunnerOutput) -> list[dict[int, float]]:
        lp = result.logprobs.get(rid)
        return [] if lp is None else [lp, *result.accepted_logprobs.get(rid, [])]

    def _advance_grammar(self, r: Request, token: int, finished: set[str]) -> None:
        """Feed an accepted output token to the request's matcher; a refusal (only possible
        when another rule banned every token the grammar allows, e.g. EOS under min_tokens)
        ends that request as aborted instead of failing the step for the whole batch."""
        if r.grammar is None:
            return
        try:
            r.grammar.accept(token)
        except GrammarError as exc:
            log.warning("request %s: %s; aborting it", r.request_id, exc)
            if r.request_id not in finished:
                self.scheduler.finish_request(r.request_id, RequestStatus.FINISHED_ABORTED)
            else:
                r.status = RequestStatus.FINISHED_ABORTED

    def _delta(self, r: Request, tokens: list[int], lps: list[dict[int, float]]) -> RequestDelta:
        if r.is_finished:
            return self._final_delta(r, tokens, lps)
        detok = self._detok.get(r.request_id)
        return RequestDelta(
            r.request_id,
            tokens,
            detok.take_new_text(False) if detok else "",
            lps,
            self._prompt_lps_once(r),
            num_prompt_tokens=r.num_prompt_tokens,
            num_cached_tokens=r.num_cached_tokens,
        )

    def _final_delta(
        self, r: Request, tokens: list[int], lps: list[dict[int, float]]
    ) -> RequestDelta:
        detok = self._detok.pop(r.request_id, None)
        if self.speculator is not None:
            self.speculator.finished(r)
        m = self.metrics
        m.finished.labels(model_name=m.model_name, finished_reason=r.status.finish_reason).inc()
        if r.finished_time is None:
            r.finished_time = time.monotonic()
        m.label(m.e2e).observe(r.finished_time - r.arrival_time)
        return RequestDelta(
            r.request_id,
            tokens,
            detok.take_new_text(True) if detok else "",
            lps,
            self._prompt_lps_once(r),
            finished=True,
            finish_reason=r.status.finish_reason,
            num_prompt_tokens=r.num_prompt_tokens,
            num_cached_tokens=r.num_cached_tokens,
        )

    @staticmethod
    def _prompt_lps_once(r: Request) -> list[dict[int, float] | None] | None:
        # A request never drafts while its prompt logprobs are pending, so its first delta
        # holds one token.
        if r.sampling_params.prompt_logprobs is None or r.num_output_tokens != 1:
            return None
        return list(r.prompt_logprobs)

    def _observe_tokens(self, r: Request, n: int, prev: float | None, now: float) -> None:
        m = self.metrics
        m.label(m.generation_tokens).inc(n)
        if r.num_output_tokens <= n:
            m.label(m.ttft).observe(now - r.arrival_time)
            m.label(m.prompt_tokens).inc(r.num_prompt_tokens)
            if r.scheduled_time is not None:
                m.label(m.queue_time).observe(r.scheduled_time - r.arrival_time)
        elif prev is not None:
            m.label(m.itl).observe(now - prev)

    def _update_gauges(self) -> None:
        m = self.metrics
        m.label(m.running).set(self.scheduler.num_running)
        m.label(m.waiting).set(self.scheduler.num_waiting)
        m.label(m.kv_usage).set(self.pool.usage())
        m.update_totals(self.kv.queries, self.kv.hits, self.scheduler.num_preemptions)

    def state(self) -> ReplicaState:
        """A snapshot for the router and operators (the replica's `/state`, wire format)."""
        resident = [] if self.lora_runtime is None else self.lora_runtime.resident_adapters
        return ReplicaState(
            wire_version=WIRE_VERSION,
            model_id=self.model_id,
            block_size=self.config.block_size,
            prefix_caching=self.config.enable_prefix_caching,
            num_blocks=self.pool.num_blocks,
            num_free_blocks=self.pool.num_free_blocks,
            kv_cache_usage=self.pool.usage(),
            num_requests_running=self.scheduler.num_running,
            num_requests_waiting=self.scheduler.num_waiting,
            resident_adapters=list(resident),
            adapter_references=(
                0 if self.lora_runtime is None else self.lora_runtime.adapter_references
            ),
            max_loras=self.config.max_loras,
            prefix_cache_queries=self.kv.queries,
            prefix_cache_hits=self.kv.hits,
            num_preemptions=self.scheduler.num_preemptions,
            weight_quantization=self.weight_quantization,
            weight_bytes=self.weight_bytes,
            kv_cache_dtype=self.config.kv_cache_dtype,
            kv_cache_bytes=self.kv_cache_bytes,
            compute_dtype=str(self.dtype).removeprefix("torch."),
            compute_dtype_reason=self.dtype_reason,
            deterministic=self.config.deterministic,
            speculative=speculative_state(
                self.speculator,
                None if self.speculator is None else self.speculator.config.draft_model,
            ),
            cold_start=[
                ColdStartPhase(name=name, start_s=start, seconds=seconds)
                for name, start, seconds in self.timeline.phases()
            ],
            cold_start_seconds=self.timeline.seconds.get("ready", 0.0),
        )

    def close(self) -> None:
        """Nothing to release on one process (an `EPEngine` stops its ranks here)."""

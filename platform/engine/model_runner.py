"""ModelRunner: turns a SchedulerOutput into one forward, then samples.

It lays the step's tokens out flat (each request's new tokens contiguous), builds the
AttentionMetadata with slots and block tables, sets the forward context (attention, and the
LoRA runtime's per-step metadata when one is installed), runs the model, computes logits
only at the rows that need them, and samples. Decode-only steps go through static buffers
(`prepare_decode_inputs` + `run_decode_step`) so `decode_graphs` can capture them as CUDA graphs
and install their replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.kv_cache import allocate_kv_cache
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampler import Sampler, topn_logprobs
from loraplex.platform.engine.scheduler import ScheduledRequest, SchedulerOutput
from loraplex.platform.engine.speculative.verify import verify
from loraplex.platform.engine.structured.bitmask import MaskFiller

if TYPE_CHECKING:
    from loraplex.platform.engine.ports import LoraRuntimeProtocol


@dataclass
class ModelRunnerOutput:
    """Per request id: the sampled token (None for a mid-prompt chunk), its logprobs dict,
    and the prompt-logprob entries this step produced; for a request that drafted, the tokens
    verified after the sampled one (`accepted`) and their logprobs."""

    sampled: dict[str, int | None] = field(default_factory=dict)
    logprobs: dict[str, dict[int, float]] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[dict[int, float] | None]] = field(default_factory=dict)
    accepted: dict[str, list[int]] = field(default_factory=dict)
    accepted_logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)


def group_by_adapter(scheduled: list[ScheduledRequest]) -> list[ScheduledRequest]:
    """The batch reordered so each adapter's tokens are one contiguous run and base rows come
    last (stable otherwise).

    Row order within a step is free (results are keyed by request id); with the adapter rows
    one run ahead of the base rows, the LoRA delta of a decode batch reads and writes one slice
    of the activations instead of gathering and scattering rows.
    """
    keys = [s.request.adapter_key for s in scheduled]
    if all(k == keys[0] for k in keys):
        return scheduled
    first: dict[str | None, int] = {}
    for k in keys:
        if k is not None:
            first.setdefault(k, len(first))
    first[None] = len(first)
    return sorted(scheduled, key=lambda s: first[s.request.adapter_key])


def logits_fn(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's `compute_logits` (hidden -> logits), checked once here so the step calls a
    typed function rather than an `nn.Module` attribute (typed `Tensor | Module`)."""
    fn = getattr(model, "compute_logits", None)
    if not callable(fn):
        raise TypeError(f"{type(model).__name__} has no compute_logits(hidden) method")
    typed: Callable[[torch.Tensor], torch.Tensor] = fn
    return typed


class ModelRunner:
    """Owns the model, its paged KV cache, the static decode buffers and the sampler."""

    def __init__(
        self,
        model: nn.Module,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        kv_dtype: torch.dtype,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        self.model = model
        self.compute_logits = logits_fn(model)
        self.device = torch.device(device)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.kv_caches = allocate_kv_cache(model, num_blocks, block_size, kv_dtype, self.device)
        self.sampler = Sampler(seed=seed, device=self.device)
        # Fills structured-output masks while the forward runs (the engine sets its vocabulary).
        self.mask_filler: MaskFiller | None = None
        self.lora_runtime: LoraRuntimeProtocol | None = None
        # Static decode inputs, sized for the largest batch; rows past the live batch are padding.
        n, dev = max_num_seqs, self.device
        self.decode_input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.decode_positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.decode_slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.decode_seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.decode_context_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.decode_block_tables = torch.zeros(
            n, self.max_blocks_per_seq, dtype=torch.int32, device=dev
        )
        self.decode_query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self._decode_max_seq_len = 1
        # Filled by `decode_graphs` after capture: padded batch size -> replay returning logits [B, V].
        self.decode_graphs: dict[int, Callable[[], torch.Tensor]] = {}
        self.lora_metadata: object | None = None
        # Set by decode_graphs when the graphs were captured with LoRA (static metadata).
        self.decode_graphs_have_lora = False

    # -- the decode fast path ------------------------------------------------------------

    def decode_batch_size(self, n: int) -> int:
        """The padded batch size for `n` decodes: the next captured size, else `n`.

        Unless the graphs were captured with LoRA, a step with LoRA metadata is not padded.
        """
        if self.lora_metadata is not None and not self._lora_graphable():
            return n
        sizes = [b for b in self.decode_graphs if b >= n]
        return min(sizes) if sizes else n

    def _lora_graphable(self) -> bool:
        """Whether this step's LoRA can replay a captured graph (expert LoRA cannot)."""
        return self.decode_graphs_have_lora and not getattr(self.lora_metadata, "eager_only", False)

    def prepare_decode_inputs(self, requests: list[Request], batch_size: int) -> None:
        """Copy this step's decode inputs into the static buffers; rows past the batch pad."""
        n, bs, pad = len(requests), self.block_size, batch_size - len(requests)
        pos = [r.num_computed_tokens for r in requests]
        ids = [r.output_token_ids[-1] if r.output_token_ids else r.prompt_token_ids[-1]
               for r in requests]  # fmt: skip
        slots = [r.block_ids[p // bs] * bs + p % bs for r, p in zip(requests, pos, strict=True)]
        width = max(len(r.block_ids) for r in requests)
        rows = [r.block_ids + [0] * (width - len(r.block_ids)) for r in requests]
        seq_lens = torch.tensor([p + 1 for p in pos] + [1] * pad, dtype=torch.int32)
        tables = torch.zeros(batch_size, self.max_blocks_per_seq, dtype=torch.int32)
        tables[:n, :width] = torch.tensor(rows, dtype=torch.int32)
        b = batch_size
        self.decode_input_ids[:b].copy_(torch.tensor(ids + [0] * pad), non_blocking=True)
        self.decode_positions[:b].copy_(torch.tensor(pos + [0] * pad), non_blocking=True)
        self.decode_slot_mapping[:b].copy_(torch.tensor(slots + [-1] * pad), non_blocking=True)
        self.decode_seq_lens[:b].copy_(seq_lens, non_blocking=True)
        self.decode_context_lens[:b].copy_(seq_lens - 1, non_blocking=True)
        self.decode_block_tables[:b].copy_(tables, non_blocking=True)
        on_gpu = self.device.type == "cuda"
        self._decode_max_seq_len = self.max_model_len if on_gpu else max(pos) + 1

    def decode_metadata(self, batch_size: int) -> AttentionMetadata:
        """Attention metadata viewing the static decode buffers' first `batch_size` rows."""
        return AttentionMetadata(
            slot_mapping=self.decode_slot_mapping[:batch_size],
            query_start_loc=self.decode_query_start_loc[: batch_size + 1],
            seq_lens=self.decode_seq_lens[:batch_size],
            context_lens=self.decode_context_lens[:batch_size],
            block_tables=self.decode_block_tables[:batch_size],
            max_query_len=1,
            max_seq_len=self._decode_max_seq_len,
            is_decode_only=True,
        )

    @torch.inference_mode()
    def run_decode_step(self, batch_size: int) -> torch.Tensor:
        """Forward the static decode buffers' first `batch_size` rows -> logits [B, V] fp32.

        Reads only device tensors and host constants, so it can be captured as a CUDA graph.
        """
        ctx = ForwardContext(attn=self.decode_metadata(batch_size), lora=self.lora_metadata)
        with forward_context(ctx):
            hidden = self.model(
                self.decode_input_ids[:batch_size], self.decode_positions[:batch_size]
            )
            return self.compute_logits(hidden)

    # -- one step ------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run the scheduled batch and sample the requests that reached their last token.

        Structured-output masks of the sampled rows are filled on a worker thread started
        here, before the forward, and joined in `_sample`, before sampling."""
        scheduled = out.scheduled
        if not scheduled:
            return ModelRunnerOutput()
        if self.lora_runtime is not None:
            scheduled = group_by_adapter(scheduled)
        states = [s.request.grammar for s in scheduled if s.samples]
        if any(g is not None for g in states):
            if self.mask_filler is None:
                raise RuntimeError("a constrained request reached a runner without a mask filler")
            self.mask_filler.start(states)
        try:
            return self._execute(scheduled)
        except BaseException:
            if self.mask_filler is not None:
                self.mask_filler.join_quietly()
            raise

    def _execute(self, scheduled: list[ScheduledRequest]) -> ModelRunnerOutput:
        self._prepare_lora(scheduled)
        decode_only = all(
            s.num_tokens == 1 and s.samples and not s.request.spec_token_ids for s in scheduled
        ) and not any(s.request.wants_prompt_logprobs for s in scheduled)
        if decode_only and len(scheduled) <= self.max_num_seqs:
            b = self.decode_batch_size(len(scheduled))
            self.prepare_decode_inputs([s.request for s in scheduled], b)
            # Base-only graphs cannot serve adapters: eager then, unless captured with LoRA.
            graphable = self.lora_metadata is None or self._lora_graphable()
            graph = self.decode_graphs.get(b) if graphable else None
            logits = graph() if graph is not None else self.run_decode_step(b)
            return self._sample(scheduled, logits[: len(scheduled)], {})
        return self._execute_mixed(scheduled)

    def _prepare_lora(self, scheduled: list[ScheduledRequest]) -> None:
        runtime = self.lora_runtime
        if runtime is None:
            self.lora_metadata = None
            return
        self.lora_metadata = runtime.prepare_step(
            [s.request for s in scheduled],
            [s.num_tokens + len(s.request.spec_token_ids) for s in scheduled],
        )

    def _execute_mixed(self, scheduled: list[ScheduledRequest]) -> ModelRunnerOutput:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        qsl, seq_lens, ctx_lens = [0], [], []
        sample_rows: list[int] = []
        # scheduled index -> (first flat row, count, first position)
        plp_rows: dict[int, tuple[int, int, int]] = {}
        tables = torch.zeros(len(scheduled), self.max_blocks_per_seq, dtype=torch.int32)
        for i, s in enumerate(scheduled):
            r, start, end = s.request, s.start, s.start + s.num_tokens
            drafts = r.spec_token_ids  # run after the known tokens, verified in `_sample`
            ids += r.token_slice(start, end) + drafts
            end_all = end + len(drafts)
            pos += range(start, end_all)
            blocks = r.block_ids
            slots += [blocks[p // bs] * bs + p % bs for p in range(start, end_all)]
            tables[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            qsl.append(qsl[-1] + s.num_tokens + len(drafts))
            seq_lens.append(end_all)
            ctx_lens.append(start)
            if s.samples:
                sample_rows += range(qsl[-1] - 1 - len(drafts), qsl[-1])
            if r.wants_prompt_logprobs:
                last = min(end, r.num_prompt_tokens - 1)  # positions predicting prompt tokens
                first = max(start, len(r.prompt_logprobs) - 1, 0)
                if last > first:
                    plp_rows[i] = (qsl[-2] + first - start, last - first, first)
        dev = self.device
        if all(s.num_tokens == 1 for s in scheduled):  # decodes, some with drafts
            qsl, seq_lens, ctx_lens, tables = self._rows_per_token(qsl, seq_lens, tables)
        md = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32).to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(dev),
            context_lens=torch.tensor(ctx_lens, dtype=torch.int32).to(dev),
            block_tables=tables.to(dev),
            max_query_len=max(qsl[i + 1] - qsl[i] for i in range(len(qsl) - 1)),
            max_seq_len=max(seq_lens),
            is_decode_only=all(qsl[i + 1] - qsl[i] == 1 for i in range(len(qsl) - 1)),
        )
        with forward_context(ForwardContext(attn=md, lora=self.lora_metadata)):
            hidden = self.model(
                torch.tensor(ids, dtype=torch.int64).to(dev),
                torch.tensor(pos, dtype=torch.int64).to(dev),
            )
        prompt_lps = self._prompt_logprobs(scheduled, hidden, plp_rows)
        sampling = [s for s in scheduled if s.samples]
        logits = None
        if sampling:
            rows = torch.tensor(sample_rows, dtype=torch.int64, device=dev)
            logits = self.compute_logits(hidden[rows])
        return self._sample(sampling, logits, prompt_lps)

    @staticmethod
    def _rows_per_token(
        qsl: list[int], seq_lens: list[int], tables: torch.Tensor
    ) -> tuple[list[int], list[int], list[int], torch.Tensor]:
        """Attention rows for a step of decodes with drafts: one single-query row per token,
        seeing its sequence up to itself (every row's K/V is written before any row attends),
        so verification runs on the decode attention path instead of the prefill one."""
        counts = [qsl[i + 1] - qsl[i] for i in range(len(seq_lens))]
        lens = [e - n + j + 1 for e, n in zip(seq_lens, counts, strict=True) for j in range(n)]
        rows = tables.repeat_interleave(torch.tensor(counts), dim=0)
        return list(range(len(lens) + 1)), lens, [n - 1 for n in lens], rows

    def _prompt_logprobs(
        self,
        scheduled: list[ScheduledRequest],
        hidden: torch.Tensor,
        plp_rows: dict[int, tuple[int, int, int]],
    ) -> dict[str, list[dict[int, float] | None]]:
        out: dict[str, list[dict[int, float] | None]] = {}
        for i, s in enumerate(scheduled):
            r = s.request
            if not r.wants_prompt_logprobs:
                continue
            entries: list[dict[int, float] | None] = [None] if not r.prompt_logprobs else []
            if i in plp_rows:
                row, count, first_pos = plp_rows[i]
                logits = self.compute_logits(hidden[row : row + count])
                lps = torch.log_softmax(logits.float(), dim=-1)
                targets = torch.tensor(
                    r.prompt_token_ids[first_pos + 1 : first_pos + 1 + count], device=lps.device
                )
                top_n = r.sampling_params.prompt_logprobs
                assert top_n is not None  # wants_prompt_logprobs: prompt logprobs were asked for
                entries += topn_logprobs(lps, targets, top_n)
            if entries:
                out[r.request_id] = entries
        return out

    def _sample(
        self,
        sampling: list[ScheduledRequest],
        logits: torch.Tensor | None,
        prompt_lps: dict[str, list[dict[int, float] | None]],
    ) -> ModelRunnerOutput:
        result = ModelRunnerOutput(prompt_logprobs=prompt_lps)
        if logits is None or not sampling:
            return result
        requests = [s.request for s in sampling]
        mask = self.mask_filler.join() if self.mask_filler is not None else None
        if any(r.spec_token_ids for r in requests):
            return self._verify(requests, logits, mask, result)
        sampled = self.sampler(logits, requests, mask)
        for r, tok, lp in zip(requests, sampled.token_ids, sampled.logprobs, strict=True):
            result.sampled[r.request_id] = tok
            if lp is not None:
                result.logprobs[r.request_id] = lp
        return result

    def _verify(
        self,
        requests: list[Request],
        logits: torch.Tensor,
        mask: torch.Tensor | None,
        result: ModelRunnerOutput,
    ) -> ModelRunnerOutput:
        """Sample every draft row and keep each request's accepted prefix (`verify`)."""
        got = verify(self.sampler, logits, requests, [r.spec_token_ids for r in requests], mask)
        for r, toks, lps in zip(requests, got.tokens, got.logprobs, strict=True):
            result.sampled[r.request_id] = toks[0]
            if len(toks) > 1:
                result.accepted[r.request_id] = toks[1:]
            if lps is not None:
                result.logprobs[r.request_id] = lps[0]
                if len(lps) > 1:
                    result.accepted_logprobs[r.request_id] = lps[1:]
        return result

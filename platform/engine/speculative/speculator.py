"""Speculator: the engine's speculation for one step: choose K, draft, reserve lookahead KV
slots (`plan`); after verification, learn acceptance and give the rejected slots back
(`settle`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampler import Sampler
from loraplex.platform.engine.scheduler import ScheduledRequest, SchedulerOutput
from loraplex.platform.engine.speculative.config import SpecConfig
from loraplex.platform.engine.speculative.controller import Controller
from loraplex.platform.engine.speculative.draft_model import DraftModel
from loraplex.platform.engine.speculative.grammar_drafts import allowed_prefix
from loraplex.platform.engine.speculative.guard import DraftGuard
from loraplex.platform.engine.speculative.ngram import NgramIndex
from loraplex.platform.engine.speculative.suffix_table import AdapterTables
from loraplex.platform.wire import AdapterRef

# Lookup rests (`Speculator._lookup`): at most MAX_REST steps, and at most batch / DIVISOR, so a
# batch of a few requests (where a lookup costs nothing next to the step) never rests.
MAX_REST = 16
REST_BATCH_DIVISOR = 4


@dataclass
class AcceptanceStats:
    """Per adapter: verifications run, tokens drafted, drafts accepted."""

    verifications: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification (accepted drafts plus the target's own), 0 if none."""
        return 0.0 if not self.verifications else 1.0 + self.accepted / self.verifications


class Speculator:
    """Plans drafts for the sampling requests of a scheduled step and settles them after."""

    def __init__(
        self,
        config: SpecConfig,
        kv: KVCacheManager,
        max_num_batched_tokens: int,
        max_model_len: int,
        drafter: DraftModel | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        if (drafter is None) != (config.draft_model is None) or (drafter and not sampler):
            raise ValueError("a draft-model method runs with a draft model and the sampler")
        self.config = config
        self.drafter = drafter
        self.sampler = sampler
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.controller = Controller(config.k_min, config.k_max, config.adaptive)
        self.guard = DraftGuard(min_batch=1) if drafter is not None else DraftGuard()
        self.tables = (
            AdapterTables(config.ngram_min, config.ngram_max, config.adapter_table_tokens)
            if config.adapter_tables
            else None
        )
        self._indexes: dict[str, NgramIndex] = {}
        self._rates: dict[str, float] = {}
        self._misses: dict[str, int] = {}  # consecutive lookups that found nothing
        self._rest: dict[str, int] = {}  # steps a request skips lookup for (see `_lookup`)
        self.stats: dict[str | None, AcceptanceStats] = {}
        self._decode_step = False  # whether the planned step was a decode step (for the guard)

    @staticmethod
    def eligible(request: Request) -> bool:
        """Whether a request may draft: pending prompt logprobs (whose rows the draft rows
        would need to share) run without speculation. Constrained requests draft exactly
        (`grammar_drafts`)."""
        return not request.wants_prompt_logprobs

    @staticmethod
    def model_eligible(request: Request) -> bool:
        """Whether the draft model may draft for it: not seeded (its output must not depend
        on whether it drafted), no logprobs (its emitted tokens are the rejection rule's) and
        no grammar (its q would need the grammar's masks); these requests draft by prompt
        lookup, which shares the sampler's draw."""
        p = request.sampling_params
        return p.seed is None and p.logprobs is None and request.grammar is None

    def plan(self, sched: SchedulerOutput) -> int:
        """Set `spec_token_ids` (and reserve their KV slots) on the step's sampling requests
        the controller gives a K; returns the number of draft tokens added to the step."""
        # Judged now: after the step the requests hold their new tokens (`samples` turns false).
        self._decode_step = _decode_only(sched)
        if not self._decode_step:  # a prefill chunk in the step: its attention path would
            return 0  # run every drafting request's rows as a prefill too
        cands = [s for s in sched.scheduled if self.eligible(s.request)]
        if not cands:
            return 0
        if self.config.adaptive and not self.guard.allows(len(sched.scheduled)):
            return 0
        num_outputs = sum(1 for s in sched.scheduled if s.samples)
        budget = self.max_num_batched_tokens - sched.num_tokens
        rates = [self._rates.get(s.request.request_id) for s in cands]
        ks = self.controller.choose(rates, sched.num_tokens, num_outputs, budget)
        added = 0
        sized: list[tuple[ScheduledRequest, int]] = []
        for s, k in zip(cands, ks, strict=True):
            r = s.request
            room = min(
                r.sampling_params.max_tokens - r.num_output_tokens - 1,
                self.max_model_len - r.num_tokens - 1,
            )
            if min(k, room) > 0:
                sized.append((s, min(k, room)))
        modelled = self._model_drafts(sized)
        rest_cap = min(MAX_REST, len(sched.scheduled) // REST_BATCH_DIVISOR)
        if not self.config.adaptive:  # drafts wherever it can (tests that must exercise it)
            rest_cap = 0
        for s, k in sized:
            r = s.request
            drafts = modelled.get(r.request_id)
            if not drafts:
                drafts = self._lookup(r, k, rest_cap)
            if r.grammar is not None:  # never verify a token the grammar refuses
                drafts = allowed_prefix(r.grammar, drafts)
            if drafts and self.kv.allocate_slots(r, s.num_tokens + len(drafts)):
                r.spec_token_ids = drafts
                added += len(drafts)
        return added

    def _lookup(self, request: Request, k: int, rest_cap: int) -> list[int]:
        """Prompt-lookup drafts, unless the request rests: after consecutive lookups that found
        nothing it skips 1, 2, 4, ... steps (at most `rest_cap`, which grows with the batch),
        so a large batch of requests that never repeat stops paying a lookup per request per
        step; one found draft ends the rest."""
        rid = request.request_id
        left = self._rest.get(rid, 0)
        if left > 0:
            self._rest[rid] = left - 1
            return []
        drafts = self.propose(request, k)
        if drafts:
            self._misses.pop(rid, None)
            return drafts
        misses = self._misses[rid] = self._misses.get(rid, 0) + 1
        if rest_cap > 0:
            self._rest[rid] = min(rest_cap, 1 << min(misses - 1, 8))
        return []

    def _model_drafts(self, sized: list[tuple[ScheduledRequest, int]]) -> dict[str, list[int]]:
        """The draft model's drafts (with their distributions) for the requests it may draft
        for, in one batch; a request it has no room for is left to prompt lookup."""
        if self.drafter is None or self.sampler is None:
            return {}
        chosen = [(s.request, k) for s, k in sized if self.model_eligible(s.request)]
        try:
            if self.config.method == "draft_adapter":  # an adapter without a draft adapter:
                chosen = [(r, k) for r, k in chosen if not self._table_first(r, k)]  # its table
            if not chosen:
                return {}
            got = self.drafter.propose([r for r, _ in chosen], [k for _, k in chosen], self.sampler)
        finally:
            if self.drafter.adapters is not None:
                self.drafter.adapters.end_step()  # this step's draft adapters, let go
        return {r.request_id: d for (r, _), d in zip(chosen, got, strict=True) if d}

    def _table_first(self, request: Request, k: int) -> bool:
        """Whether an adapter's request without a draft adapter drafts from the n-gram tables
        (they propose something) rather than the plain draft model."""
        drafter = self.drafter
        if request.adapter_key is None or drafter is None or drafter.draft_key(request):
            return False
        return bool(self.propose(request, k))

    def register_draft_adapter(self, target_key: str, ref: object) -> str:
        """Tie a draft adapter (for the draft model) to the target adapter version
        `target_key` (method draft_adapter); returns the draft adapter's key."""
        if self.drafter is None or self.drafter.adapters is None:
            raise ValueError("draft adapters need speculative method 'draft_adapter'")
        return self.drafter.adapters.register(target_key, ref)

    def tie_drafts(self, target_key: str | None, ref: object) -> str | None:
        """Tie the draft adapter a request's adapter reference carries for this replica's
        draft model (`AdapterRef.drafts`, from the gateway) to the target version `target_key`;
        returns its key, None when the reference carries none for this draft model or the
        replica runs no draft adapters (the request then drafts otherwise). A reference from
        the gateway without one unties any earlier one (the tenant deleted it)."""
        drafter = self.drafter
        if target_key is None or drafter is None or drafter.adapters is None:
            return None
        if not isinstance(ref, AdapterRef):  # a local folder (tests, benchmarks): tied by hand
            return None
        mine = [d for d in ref.drafts or () if d.draft_model == self.config.draft_model]
        if not mine:
            drafter.adapters.unregister(target_key)
            return None
        return drafter.adapters.tie(target_key, mine[0])

    def propose(self, request: Request, k: int) -> list[int]:
        """Up to `k` drafts: prompt lookup over the request's own tokens, else the suffix table
        of its adapter's past outputs."""
        cfg = self.config
        index = self._indexes.get(request.request_id)
        if index is None:
            index = self._indexes[request.request_id] = NgramIndex(cfg.ngram_min, cfg.ngram_max)
        index.extend(request.token_slice(len(index.tokens), request.num_tokens))
        suffix = index.tokens[-cfg.ngram_max :]
        drafts = index.propose(suffix, k, own=True)
        if not drafts and self.tables is not None:
            drafts = self.tables.propose(request.adapter_key, suffix, k)
        return drafts

    def end_step(
        self, sched: SchedulerOutput, num_drafted: int, num_emitted: int, seconds: float
    ) -> None:
        """Feed one whole engine step's measured cost to the controller (forward tokens with
        their drafts) and, for a decode step, to the guard (seconds per emitted token)."""
        self.controller.costs.observe(sched.num_tokens + num_drafted, seconds)
        if self._decode_step:
            self.guard.record(len(sched.scheduled), num_drafted > 0, seconds, num_emitted)

    def settle(self, sched: SchedulerOutput, emitted: Mapping[str, list[int]]) -> None:
        """After the scheduler applied the step: record each drafting request's acceptance,
        free its rejected lookahead blocks, and clear its drafts."""
        for s in sched.scheduled:
            r = s.request
            drafts = r.spec_token_ids
            if not drafts:
                continue
            r.spec_token_ids = []
            tokens = emitted.get(r.request_id)
            if tokens is not None:
                accepted = len(tokens) - 1
                rid = r.request_id
                self._rates[rid] = self.controller.updated_rate(
                    self._rates.get(rid), len(drafts), accepted
                )
                st = self.stats.setdefault(r.adapter_key, AcceptanceStats())
                st.verifications += 1
                st.drafted += len(drafts)
                st.accepted += accepted
            if not r.is_finished:
                self.kv.trim(r, r.num_computed_tokens)

    def finished(self, request: Request) -> None:
        """Forget a finished request; its output joins its adapter's suffix table."""
        self._indexes.pop(request.request_id, None)
        self._rates.pop(request.request_id, None)
        self._misses.pop(request.request_id, None)
        self._rest.pop(request.request_id, None)
        if self.drafter is not None:
            self.drafter.release(request.request_id)
        if self.tables is not None and request.status.finish_reason != "abort":
            self.tables.add_output(request.adapter_key, request.output_token_ids)


def _decode_only(sched: SchedulerOutput) -> bool:
    """Whether every scheduled request runs one known token (a decode step)."""
    return all(s.num_tokens == 1 and s.samples for s in sched.scheduled)

"""Scheduler: iteration-level batching of decode tokens and prefill chunks.

Every step it first gives each running request its next tokens (decodes first, then a chunk
for each unfinished prefill), preempting the newest running requests by recompute when KV
blocks run out, then admits waiting requests while the token budget
(`max_num_batched_tokens`), the sequence limit (`max_num_seqs`), the KV pool and the
admission policy allow. Admission is fair across tenants (`tenant_fairness.py`): round-robin,
the tenant with the fewest running requests first, and running prefill chunks leave room for
the first prompt of a tenant that has nothing running; one tenant alone is served in arrival
order; while tenants share, prefill chunks add about `shared_prefill_s` to a step. A
request's progress is one number, `num_computed_tokens`, so a prefill chunk and a decode are
the same thing: "run the next N tokens".
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request, RequestStatus
from loraplex.platform.engine.tenant_fairness import (
    SharedPrefillBudget,
    fair_order,
    prefill_reserve,
    shared,
)


class AdmissionPolicy(Protocol):
    """Gate on admitting waiting requests (the multi-LoRA runtime limits adapters per batch)."""

    def begin_step(self, step: int, waiting: Iterable[Request]) -> None:
        """A step's admission starts: the scheduler's step number (steps that ran a batch so
        far) and its live waiting queue (to read, never to change)."""
        ...

    def can_admit(self, request: Request) -> bool:
        """May this waiting request join the running batch now?"""
        ...

    def on_admitted(self, request: Request) -> None:
        """The request joined the running batch."""
        ...

    def on_released(self, request: Request) -> None:
        """The request left the running batch (finished, aborted or preempted)."""
        ...


class AdmitAll:
    """The default policy: admit everything, track nothing."""

    def begin_step(self, step: int, waiting: Iterable[Request]) -> None:
        """Nothing to track."""

    def can_admit(self, request: Request) -> bool:
        """Always True."""
        return True

    def on_admitted(self, request: Request) -> None:
        """Nothing to track."""

    def on_released(self, request: Request) -> None:
        """Nothing to track."""


@dataclass
class ScheduledRequest:
    """One request's share of a step: run tokens [start, start + num_tokens)."""

    request: Request
    num_tokens: int
    start: int

    @property
    def samples(self) -> bool:
        """True when this step reaches the request's last known token, so it samples the next."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    """One step's batch, in the order the model runner lays it out."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens in the step's forward."""
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when nothing was scheduled."""
        return not self.scheduled


class Scheduler:
    """Decides each step's batch and applies each step's sampled tokens."""

    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        policy: AdmissionPolicy | None = None,
        shared_prefill_s: float = 0.0,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy: AdmissionPolicy = policy or AdmitAll()
        self.prefill_budget = SharedPrefillBudget(shared_prefill_s)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_steps = 0
        """Steps that scheduled a batch so far (the clock of admission fairness)."""

    # -- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request; raises ValueError if it can never fit."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if request.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt has {request.num_prompt_tokens} tokens; max_model_len is "
                f"{self.max_model_len} (the prompt must leave room for one output token)"
            )
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """End a request now (abort, or stop string found by the detokenizer); frees its blocks."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
            self.policy.on_released(request)
        else:
            self.waiting.remove(request)
        self.kv.free(request)
        request.status = status
        request.finished_time = time.monotonic()
        return request

    def has_unfinished(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.requests)

    # -- one step ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch: running requests first (decodes, then prefill chunks), then
        waiting ones in fair order."""
        self.policy.begin_step(self.num_steps, self.waiting)
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        seats = self.max_num_seqs - len(self.running)
        room = self._prefill_room(budget)
        reserve = prefill_reserve(self.waiting, self.running, room, seats)
        kept: list[Request] = []
        # Decodes first (stable: running order within each kind).
        queue = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        while queue and budget > 0:
            request = queue.pop(0)
            left = request.num_tokens - request.num_computed_tokens
            n = min(left, budget if left <= 1 else min(budget, room) - reserve)
            if n <= 0:  # a prefill chunk waits a step: its room is held for a new tenant
                kept.append(request)
                continue
            while not self.kv.allocate_slots(request, n):
                victim = queue.pop() if queue else request
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                kept.append(request)
                out.scheduled.append(ScheduledRequest(request, n, request.num_computed_tokens))
                budget -= n
                room -= n if left > 1 else 0
        kept.extend(queue)  # running requests the budget did not reach stay running
        self.running = kept
        if not out.preempted:
            self._admit_waiting(out, min(budget, room))
        now = time.monotonic()
        for s in out.scheduled:
            if s.request.scheduled_time is None:
                s.request.scheduled_time = now
        if out.scheduled:
            self.num_steps += 1
        return out

    def _prefill_room(self, budget: int) -> int:
        """Tokens this step's prefill chunks may take: all of `budget`, unless tenants share
        the engine (then what adds about `shared_prefill_s` to the step)."""
        if self.prefill_budget.target_s <= 0 or not shared(self.waiting, self.running):
            return budget
        return self.prefill_budget.tokens(budget)

    def observe_step(self, out: SchedulerOutput, seconds: float) -> None:
        """A step of `out` took `seconds` (what sizes shared steps' prefill; nothing when the
        cap is off)."""
        if self.prefill_budget.target_s <= 0:
            return
        prefill = sum(s.num_tokens for s in out.scheduled if not s.samples or s.num_tokens > 1)
        self.prefill_budget.observe(out.num_tokens - prefill, prefill, seconds)

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        if not self.waiting or budget <= 0 or len(self.running) >= self.max_num_seqs:
            return
        admitted: set[int] = set()
        for request in fair_order(self.waiting, self.running):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if not self.policy.can_admit(request):
                continue
            computed, num_cached = self.kv.get_computed_blocks(request)
            n = request.num_tokens - num_cached
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            if not self.kv.allocate_slots(request, n, computed):
                break
            admitted.add(id(request))
            if request.num_preemptions == 0:
                self.kv.record_lookup(request.num_prompt_tokens, num_cached)
            request.num_cached_tokens = max(request.num_cached_tokens, num_cached)
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.policy.on_admitted(request)
            out.scheduled.append(ScheduledRequest(request, n, num_cached))
            budget -= n
        if admitted:
            self.waiting = deque(r for r in self.waiting if id(r) not in admitted)

    def _preempt(self, request: Request) -> None:
        """Recompute-style preemption: drop the KV, send the request back to the queue's head."""
        if request in self.running:
            self.running.remove(request)
        self.kv.free(request)
        self.policy.on_released(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update(
        self,
        out: SchedulerOutput,
        sampled: dict[str, int | None],
        accepted: dict[str, list[int]] | None = None,
    ) -> list[Request]:
        """Apply a step's results: advance progress, append sampled tokens, finish requests.

        `sampled` maps request id to the new token (None for a prefill chunk that did not
        reach the end of the prompt); `accepted`, to the tokens after it that speculation
        verified in the same forward (each one's KV computed). Returns the requests that
        finished in this step.
        """
        finished: list[Request] = []
        now = time.monotonic()
        for s in out.scheduled:
            request = s.request
            if request.is_finished or request.request_id not in self.requests:
                continue
            request.num_computed_tokens += s.num_tokens
            token = sampled.get(request.request_id)
            if token is None:
                continue
            if request.first_token_time is None:
                request.first_token_time = now
            request.last_token_time = now
            more = accepted.get(request.request_id, []) if accepted else []
            for i, tok in enumerate([token, *more]):
                request.num_computed_tokens += 1 if i else 0
                request.output_token_ids.append(tok)
                status = self._check_stop(request, tok)
                if status is not None:
                    done = self.finish_request(request.request_id, status)
                    assert done is not None  # it was live a line above
                    finished.append(done)
                    break
        return finished

    def _check_stop(self, request: Request, token: int) -> RequestStatus | None:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    # -- introspection -----------------------------------------------------------------

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued (new or preempted)."""
        return len(self.waiting)

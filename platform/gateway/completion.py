"""One completion request from job to choice events: the job (built by its endpoint,
`endpoints.py`), the context-length and sampling rules it is built with, the `n` choices
fanned out to replicas through the router, and metering of what was used. `responses.py`
turns the events into OpenAI objects or SSE frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway import openai_schemas as oa
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.gateway.openai_structured import Constraints, ToolPlan
from loraplex.platform.gateway.ratelimit import RateLimitResult
from loraplex.platform.gateway.resolve import ResolvedModel, adapter_ref
from loraplex.platform.gateway.router import Dispatch
from loraplex.platform.gateway.service import Gateway
from loraplex.platform.gateway.streaming import spawn
from loraplex.platform.gateway.usage import Usage
from loraplex.platform.services import request_log
from loraplex.platform.wire import DeltaEvent, FinishEvent, GenerateRequest, SamplingOptions

if TYPE_CHECKING:
    from loraplex.platform.gateway.endpoints import Endpoint

SEED_MASK = 2**63 - 1
log = logging.getLogger(__name__)


@dataclass
class Job:
    """A validated, tokenized request ready to dispatch: the wire request its choices are
    sent as (`wire`, built once), and what the gateway keeps to answer and meter it."""

    endpoint: Endpoint
    model: str
    resolved: ResolvedModel
    wire: GenerateRequest
    max_tokens: int
    n: int
    top_n: int | None
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    stream: bool
    include_usage: bool
    cid: str = ""
    created: int = field(default_factory=oa.now)
    started: float = field(default_factory=time.monotonic)
    limit: RateLimitResult | None = None
    tools: ToolPlan | None = None  # chat: how tool calls are read from the output
    served_by: str | None = None  # the deployment whose replica answered (usage names it)

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids."""
        return self.wire.prompt_token_ids

    @property
    def sampling(self) -> SamplingOptions:
        """What the replica samples with."""
        return self.wire.sampling

    def choice_request(self, index: int) -> GenerateRequest:
        """The wire request of choice `index`: its own request id and, for a seeded request,
        the seed plus `index` (so the `n` choices differ and each reproduces)."""
        update: dict[str, Any] = {"request_id": f"{self.cid}-{index}"}
        seed = self.wire.sampling.seed
        if seed is not None and index:
            seeded = {"seed": (seed + index) & SEED_MASK}
            update["sampling"] = self.wire.sampling.model_copy(update=seeded)
        return self.wire.model_copy(update=update)


def wire_request(
    cid: str,
    prompt_ids: list[int],
    sampling: SamplingOptions,
    resolved: ResolvedModel,
    tenant_id: uuid.UUID,
    cache_salt: str | None,
) -> GenerateRequest:
    """The wire request of a job's first choice (`Job.choice_request` derives the others)."""
    return GenerateRequest(
        request_id=f"{cid}-0",
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        adapter=adapter_ref(resolved, tenant_id),
        cache_salt=cache_salt,
    )


def max_tokens_for(
    requested: int | None, prompt_len: int, ctx: int, default: int, param: str
) -> int:
    """The completion's token budget: what was asked, else the default, within the context."""
    room = ctx - prompt_len
    if room < 1:
        raise HttpError(
            400,
            f"This model's maximum context length is {ctx} tokens; the prompt has {prompt_len}.",
            param=param,
            code="context_length_exceeded",
        )
    if requested is None:
        return min(default, room)
    if prompt_len + requested > ctx:
        raise HttpError(
            400,
            f"This model's maximum context length is {ctx} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the "
            "completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


@dataclass(frozen=True)
class PromptSize:
    """A prompt's UTF-8 size, known from the parsed body alone, with what its check needs:
    a route can refuse a prompt too long for the model before the text itself moves."""

    size: int
    requested: int | None
    param: str


def utf8_size(text: str) -> int:
    """`text`'s length in UTF-8 bytes (lone surrogates, which JSON can carry, count as 3)."""
    return len(text.encode("utf-8", "surrogatepass"))


def prompt_size(body: Any) -> PromptSize | None:
    """The size `check_prompt_length` will check, when the body alone says it: a text
    completion's prompt string (a chat's is known only once its template is rendered)."""
    if isinstance(body, oa.CompletionRequest):
        prompt = body.prompt_text_or_ids()
        if isinstance(prompt, str):
            return PromptSize(utf8_size(prompt), body.requested_max_tokens(), "prompt")
    return None


def check_prompt_length(text: str, assets: ModelAssets, requested: int | None, param: str) -> None:
    """Refuse a prompt whose length in bytes alone proves it cannot fit the context (with
    `requested` completion tokens), before any time is spent tokenizing it."""
    check_prompt_size(PromptSize(utf8_size(text), requested, param), assets)


def check_prompt_size(prompt: PromptSize, assets: ModelAssets) -> None:
    """`check_prompt_length` on a prompt's size."""
    size, requested, param = prompt.size, prompt.requested, prompt.param
    floor = assets.min_tokens(size)
    ctx = assets.context_length
    if floor < ctx and (requested is None or floor + requested <= ctx):
        return
    if floor >= ctx:
        message = (
            f"This model's maximum context length is {ctx} tokens; the prompt's {size} bytes "
            f"are at least {floor} tokens."
        )
    else:
        # floor < ctx, so the early return above saw a `requested` (not None) that does not fit.
        assert requested is not None
        message = (
            f"This model's maximum context length is {ctx} tokens. However, you requested at "
            f"least {floor + requested} tokens (the prompt's {size} bytes are at least {floor} "
            f"tokens, and {requested} for the completion). Please reduce the prompt or max_tokens."
        )
    raise HttpError(
        400,
        message,
        param=param if floor >= ctx else "max_tokens",
        code="context_length_exceeded",
    )


def sampling_for(
    body: oa.SamplingFields, max_tokens: int, logprobs: int | None, constraints: Constraints
) -> SamplingOptions:
    """What the replica samples with; fields the client left out take the engine's defaults
    (OpenAI's: temperature 1, top_p 1, no penalties). Stop strings, logit bias and the output
    constraint (`openai_structured`) are applied there."""
    if body.min_tokens is not None and body.min_tokens > max_tokens:
        raise HttpError(
            400,
            f"Invalid request: `min_tokens` ({body.min_tokens}) exceeds the {max_tokens} "
            "tokens this request may generate.",
            param="min_tokens",
            code="invalid_value",
        )
    return SamplingOptions(
        temperature=body.temperature,
        top_p=body.top_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        stop=body.stops() or None,
        max_tokens=max_tokens,
        logprobs=logprobs,
        seed=None if body.seed is None else body.seed & SEED_MASK,
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        **constraints.sampling_fields(),
    )


Event = tuple[int, DeltaEvent | FinishEvent]
"""One replica event of choice `index`: the only form output takes between replica and client."""


async def _choice_events(gw: Gateway, job: Job, index: int) -> AsyncGenerator[Event, None]:
    """Events of one choice; aborts its replica request if closed before it finished."""
    req = job.choice_request(index)
    where: list[Dispatch] = []
    events = gw.router.generate(
        job.resolved.deployment_name,
        req,
        job.resolved.adapter_key,
        where.append,
        cold_start_wait_s=job.resolved.cold_start_wait_s,
        routes=job.resolved.deployment_routes or None,
    )
    finished = False
    first = True
    try:
        async for event in events:
            if first:
                first = False
                job.served_by = where[-1].replica.deployment
                gw.router.metrics.ttft.labels(job.served_by).observe(time.monotonic() - job.started)
            if isinstance(event, FinishEvent):
                finished = True
                log.debug(
                    "%s: %d cached prompt tokens (router predicted %d)",
                    where[-1].request_id,
                    event.usage.cached_tokens,
                    where[-1].predicted_cached_tokens,
                )
            yield index, event
    finally:
        request_log.note_route(job.resolved, [d.replica for d in where])
        if not finished and where:
            spawn(_abort(gw, job, where[-1], metered=first))
        await events.aclose()


async def _abort(gw: Gateway, job: Job, dispatch: Dispatch, metered: bool) -> None:
    """Abort a choice on its replica; when it ended before its first token (`metered`), the
    prompt tokens the replica had computed for it are recorded and charged, so a client that
    leaves early does not get prefill for free."""
    computed = await gw.client.abort(dispatch.replica.url, dispatch.request_id)
    if not metered or computed <= 0:
        return
    job.served_by = job.served_by or dispatch.replica.deployment
    gw.usage.record(
        Usage(
            tenant_id=job.tenant_id,
            model=job.model,
            prompt_tokens=computed,
            completion_tokens=0,
            cached_tokens=0,
            latency_ms=int((time.monotonic() - job.started) * 1000),
            api_key_id=job.api_key_id,
            deployment_id=_served_deployment(job),
            adapter_version_id=job.resolved.adapter_version_id,
        )
    )
    await gw.limiter.charge(str(job.tenant_id), computed)


_END = object()


async def merged_events(gw: Gateway, job: Job) -> AsyncGenerator[Event, None]:
    """All choices' events interleaved as they come; errors re-raised in order of arrival."""
    if job.n == 1:
        # `aclosing`: an exit by exception or close must finalize the inner generator now
        # (its `finally` aborts the replica request), not whenever the GC gets to it.
        async with contextlib.aclosing(_choice_events(gw, job, 0)) as events:
            async for event in events:
                yield event
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(index: int) -> None:
        try:
            async with contextlib.aclosing(_choice_events(gw, job, index)) as events:
                async for event in events:
                    await queue.put(event)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(exc)
        finally:
            await queue.put(_END)

    tasks = [asyncio.get_running_loop().create_task(pump(i)) for i in range(job.n)]
    try:
        remaining = job.n
        while remaining:
            item = await queue.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


class Tally:
    """Token counts across choices, for `usage` and metering."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.served = False
        # Set when the request broke after admission (counted in the console's error rate).
        self.failed = False
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None

    def add(self, event: DeltaEvent | FinishEvent) -> None:
        """Count one event (and when its tokens arrived, for TTFT and inter-token latency)."""
        self.served = True
        if isinstance(event, FinishEvent):
            self.cached_tokens = max(self.cached_tokens, event.usage.cached_tokens)
            return
        if event.token_ids:
            self.completion_tokens += len(event.token_ids)
            now = time.monotonic()
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now

    def latencies(self, started: float) -> tuple[int | None, float | None]:
        """(time to first token in ms, mean gap between later tokens in ms), None if unknown."""
        if self.first_token_at is None or self.last_token_at is None:
            return None, None
        ttft = int((self.first_token_at - started) * 1000)
        later = self.completion_tokens - 1
        itl = (self.last_token_at - self.first_token_at) * 1000 / later if later > 0 else None
        return ttft, None if itl is None else round(itl, 3)

    def usage(self) -> dict[str, Any]:
        """The OpenAI `usage` object."""
        return oa.usage_dict(self.prompt_tokens, self.completion_tokens, self.cached_tokens)


def release_job(gw: Gateway, job: Job) -> None:
    """The request never ran: give back everything it was charged."""
    if job.limit is not None:
        spawn(gw.limiter.refund(str(job.tenant_id), job.limit, 0))


def _served_deployment(job: Job) -> uuid.UUID:
    """The id of the deployment that answered (the resolved one when none did)."""
    for route in job.resolved.deployment_routes:
        if route.name == job.served_by:
            return route.id
    return job.resolved.deployment_id


def _usage(job: Job, tally: Tally) -> Usage:
    ttft_ms, itl_ms = tally.latencies(job.started)
    return Usage(
        tenant_id=job.tenant_id,
        model=job.model,
        prompt_tokens=tally.prompt_tokens,
        completion_tokens=tally.completion_tokens,
        cached_tokens=tally.cached_tokens,
        latency_ms=int((time.monotonic() - job.started) * 1000),
        api_key_id=job.api_key_id,
        deployment_id=_served_deployment(job),
        adapter_version_id=job.resolved.adapter_version_id,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        failed=tally.failed,
    )


def finish_job(gw: Gateway, job: Job, tally: Tally) -> None:
    """Meter usage and give back unused rate-limit tokens (all of them if nothing ran)."""
    if not tally.served:
        release_job(gw, job)
        if tally.failed:
            gw.usage.record(_usage(job, tally))
        return
    gw.usage.record(_usage(job, tally))
    if job.limit is not None:
        spawn(
            gw.limiter.refund(
                str(job.tenant_id), job.limit, tally.prompt_tokens + tally.completion_tokens
            )
        )

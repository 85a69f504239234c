"""OpenAI-compatible inference routes: `/v1/chat/completions`, `/v1/completions`,
`/v1/models`, `/v1/models/{id}`, the per-adapter aliases `/v1/adapters/{name}/...`,
`/v1/usage` and `/v1/limits`. Include `router` in the app; its lifespan builds the `Gateway` from
`app.state.settings` (or uses `app.state.gateway` when one is already set).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import date
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from loraplex.platform.errors import HttpError, client_closed
from loraplex.platform.gateway import completion, responses
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.gateway.completion import check_prompt_size
from loraplex.platform.gateway.deployment_choice import DEPLOYMENT_HEADER
from loraplex.platform.gateway.endpoints import CHAT, TEXT, Endpoint
from loraplex.platform.gateway.errors import model_not_found
from loraplex.platform.gateway.openai_models import (
    ChatCompletion,
    Limits,
    ModelList,
    ModelObject,
    TextCompletion,
    UsageList,
)
from loraplex.platform.gateway.ratelimit import TenantLimits, tenant_limits
from loraplex.platform.gateway.request_parsing import (
    Parked,
    drop,
    park_elsewhere,
    parse_request,
    take,
)
from loraplex.platform.gateway.resolve import (
    Generation,
    NoDeployment,
    ResolvedModel,
    with_named_deployment,
)
from loraplex.platform.gateway.service import Gateway
from loraplex.platform.gateway.streaming import bounded_relay
from loraplex.platform.services import model_catalog, request_log
from loraplex.platform.services.names import has_control_characters
from loraplex.platform.services.upload_limits import limits_view_for
from loraplex.platform.services.usage_report import usage_report_for

log = logging.getLogger(__name__)
INFERENCE_SCOPE = "inference"
INLINE_PARSE_BYTES = 32 * 1024  # larger bodies are parsed on the text workers
# A body this small renders and tokenizes in well under a millisecond: on the event loop it
# costs less than the hop to a text worker and back; larger ones go to the workers.
INLINE_BUILD_BYTES = 2 * 1024


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    gw: Gateway | None = getattr(app.state, "gateway", None)
    owned = False
    settings = getattr(app.state, "settings", None)
    if (
        gw is None
        and settings is not None
        and settings.database_url
        and settings.gateway_redis_url()
        and settings.replica_secret
    ):
        gw = Gateway.from_settings(settings)
        app.state.gateway = gw
        owned = True
    elif gw is None and settings is not None and not settings.replica_secret:
        log.warning("inference is off: LORAPLEX_REPLICA_SECRET (the replicas' secret) is unset")
    if gw is not None:
        await gw.start()
    try:
        yield
    finally:
        if gw is not None and owned:
            await gw.close()
            app.state.gateway = None  # closed: a later start builds a new one


router = APIRouter(lifespan=_lifespan, tags=["openai"])


class ClosingStreamingResponse(StreamingResponse):
    """A stream whose body iterator is always closed when the response ends.

    Starlette cancels the sending task when the client disconnects but leaves the body
    generator suspended, to be finalized whenever the GC gets to it; closing it here runs
    its cleanup (which aborts the request on the replica) at once."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]  # an async generator here


def _gateway(request: Request) -> Gateway:
    gw = getattr(request.app.state, "gateway", None)
    if gw is None:
        raise HttpError(
            503,
            "The inference gateway is not configured (database, Redis and the replica secret "
            "are required).",
            type="service_unavailable",
            code="gateway_unavailable",
        )
    return gw


@dataclass(frozen=True)
class Caller:
    """An authenticated inference request: the tenant, its key, the tenant's limits, and its
    resolution generation when read with the key (one round trip to Redis for both)."""

    tenant_id: uuid.UUID
    key_id: uuid.UUID
    limits: TenantLimits
    names: Generation | None = None


async def _authenticate(gw: Gateway, request: Request) -> Caller:
    """The caller (its limits come with the key, in the same query); 401 for a missing,
    unknown or revoked key, 403 without the `inference` scope."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HttpError(
            401,
            "You didn't provide an API key. Pass it as `Authorization: Bearer KEY`.",
            type="invalid_request_error",
            code="invalid_api_key",
        )
    use, names = await gw.key_check(token.strip())
    if use is None:
        raise HttpError(
            401,
            "Incorrect or revoked API key provided.",
            type="invalid_request_error",
            code="invalid_api_key",
        )
    if INFERENCE_SCOPE not in use.scopes:
        raise HttpError(
            403,
            "This API key has no `inference` scope.",
            type="permission_error",
            code="insufficient_scope",
        )
    return Caller(use.tenant_id, use.key_id, tenant_limits(use, gw.settings), names)


async def _parsed_body(
    gw: Gateway, request: Request, endpoint: Endpoint, adapter: str | None, tenant: str
) -> tuple[Any, bytes]:
    """The body, read under the route's byte limit (the body-limit middleware refuses it as
    the bytes pass the limit), parsed and validated off the event loop (in `tenant`'s turn)
    when it is large; returns it with the body's bytes. The largest are `Parked` in the parse
    process, to be taken once the model they name is known (`_resolved`)."""
    raw = await request.body()
    if len(raw) > gw.settings.max_request_bytes:
        raise HttpError(
            413,
            f"The request body is larger than {gw.settings.max_request_bytes} bytes.",
            code="request_too_large",
        )
    if len(raw) <= INLINE_PARSE_BYTES:
        return parse_request(raw, endpoint, adapter), raw
    if len(raw) < gw.settings.parse_process_min_bytes:
        return await gw.text.run_for(tenant, parse_request, raw, endpoint, adapter), raw
    # in the tenant's turn on a text worker, which waits on the parse process
    return await gw.text.run_for(tenant, park_elsewhere, gw.parser, raw, endpoint, adapter), raw


async def _resolved(
    gw: Gateway, request: Request, parsed: Any, raw: bytes, endpoint: Endpoint,
    adapter: str | None, caller: Caller,
) -> tuple[Any, str, ResolvedModel, ModelAssets]:  # fmt: skip
    """The body, the model name the request uses, that model resolved, and its assets: a
    parked body is refused here if its prompt's size alone is too long for the model (so a
    refused prompt never crosses back from the parse process), else taken."""
    model = adapter if adapter is not None else parsed.model
    tenant_id = caller.tenant_id
    try:
        _check_model_name(model)
        resolved = await gw.resolver.resolve(gw.session_factory, tenant_id, model, caller.names)
        resolved = with_named_deployment(resolved, request.headers.get(DEPLOYMENT_HEADER))
        request_log.note_route(resolved, [])  # a refusal from here on still names the version
        assets = await gw.model_assets(resolved)
        if isinstance(parsed, Parked):
            if parsed.prompt is not None:
                check_prompt_size(parsed.prompt, assets)
            args = (gw.parser, parsed, raw, endpoint, adapter)
            parsed = await gw.text.run_for(str(tenant_id), take, *args)
    except BaseException:
        if isinstance(parsed, Parked):
            drop(gw.parser, parsed)
        raise
    return parsed, model, resolved, assets


def _check_model_name(model: str) -> None:
    """A model name with control characters (NUL among them) names nothing: refuse it here,
    before it reaches a query."""
    if has_control_characters(model):
        raise HttpError(
            400,
            "`model` contains a control character.",
            param="model",
            code="invalid_name",
        )


async def _client_gone(request: Request) -> None:
    """Return when the client disconnects (the body is read, so the next ASGI message is the
    disconnect): an abort at once, not at the next poll."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, Any]) -> Any:
    """Await `work`, cancelling it (which aborts its replica requests) the moment the client
    leaves."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise client_closed()
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
        with contextlib.suppress(BaseException):
            await gone


async def _run(request: Request, endpoint: Endpoint, adapter: str | None) -> Response:
    gw = _gateway(request)
    caller = await _authenticate(gw, request)
    tenant_id, key_id, limits = caller.tenant_id, caller.key_id, caller.limits
    # Limits first: a request over them costs no parsing, templating or tokenizing.
    admitted = await gw.refusals.paused(str(tenant_id), gw.limiter.admit(str(tenant_id), limits))
    request.state.response_headers = admitted.headers()
    parsed, raw = await _parsed_body(gw, request, endpoint, adapter, str(tenant_id))
    parsed, model, resolved, assets = await _resolved(
        gw, request, parsed, raw, endpoint, adapter, caller
    )
    salt = resolved.cache_salt(tenant_id, gw.replica_secret)
    args = (parsed, resolved, assets, tenant_id, key_id, gw.settings.default_max_tokens, model,
            salt)  # fmt: skip
    if len(raw) <= INLINE_BUILD_BYTES:
        job = endpoint.build_job(*args)
    else:
        job = await gw.text.run_for(str(tenant_id), endpoint.build_job, *args)
    tokens = len(job.prompt_ids) + job.n * job.max_tokens
    job.limit = await gw.refusals.paused(
        str(tenant_id), gw.limiter.acquire_tokens(str(tenant_id), tokens, limits)
    )
    headers = job.limit.headers()
    request.state.response_headers = headers  # errors from here on carry them too
    if not job.stream:
        body = await _unless_disconnected(request, responses.complete(gw, job))
        return JSONResponse(body, headers=headers)
    try:
        # A client that leaves before the first token aborts at once, not after its prefill.
        first, rest = await _unless_disconnected(request, responses.primed(gw, job))
    except BaseException:
        completion.release_job(gw, job)
        raise
    frames = responses.sse_frames(gw, job, first, rest)
    relay = bounded_relay(
        frames,
        max_buffer=gw.settings.stream_buffer_frames,
        stall_timeout_s=gw.settings.stream_stall_timeout_s,
    )
    stream_headers = {**headers, "cache-control": "no-cache", "x-accel-buffering": "no"}
    return ClosingStreamingResponse(relay, media_type="text/event-stream", headers=stream_headers)


@router.post("/v1/chat/completions", response_model=ChatCompletion)
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions (streamed or not)."""
    return await _run(request, CHAT, None)


@router.post("/v1/completions", response_model=TextCompletion)
async def completions(request: Request) -> Response:
    """OpenAI (legacy) text completions."""
    return await _run(request, TEXT, None)


@router.post("/v1/adapters/{name}/chat/completions", response_model=ChatCompletion)
async def adapter_chat_completions(name: str, request: Request) -> Response:
    """Chat completions against one adapter named in the path (its `model` field is ignored)."""
    return await _run(request, CHAT, name)


@router.post("/v1/adapters/{name}/completions", response_model=TextCompletion)
async def adapter_completions(name: str, request: Request) -> Response:
    """Text completions against one adapter named in the path."""
    return await _run(request, TEXT, name)


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> Response:
    """Base models and the caller's adapters that have a ready version."""
    gw = _gateway(request)
    tenant_id = (await _authenticate(gw, request)).tenant_id
    data = await asyncio.to_thread(model_catalog.list_models, gw.session_factory, tenant_id)
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model_id:path}", response_model=ModelObject)
async def get_model(model_id: str, request: Request) -> Response:
    """One model: a base model, an adapter `NAME` or a version `NAME:N` the caller can use."""
    gw = _gateway(request)
    tenant_id = (await _authenticate(gw, request)).tenant_id
    try:
        resolved = await gw.resolver.resolve(gw.session_factory, tenant_id, model_id)
    except NoDeployment:  # it exists, but nothing serves it: not a model one can use
        raise model_not_found(model_id) from None
    if resolved.adapter_id is None:
        entry = model_catalog.model_object(model_id, resolved.base_created, "loraplex", None)
    else:
        entry = model_catalog.model_object(
            model_id, resolved.base_created, str(tenant_id), resolved.base_model_name
        )
    return JSONResponse(entry)


@router.get("/v1/usage", response_model=UsageList)
async def get_usage(
    request: Request, start: date | None = None, end: date | None = None
) -> Response:
    """The caller's usage per day and per adapter (or base model)."""
    gw = _gateway(request)
    tenant_id = (await _authenticate(gw, request)).tenant_id
    rows = await asyncio.to_thread(usage_report_for, gw.session_factory, tenant_id, start, end)
    return JSONResponse({"object": "list", "data": rows})


@router.get("/v1/limits", response_model=Limits)
async def get_limits(request: Request) -> Response:
    """The caller's rate limits and monthly token quota, and what remains of each now."""
    gw = _gateway(request)
    caller = await _authenticate(gw, request)
    body = await gw.limiter.snapshot(str(caller.tenant_id), caller.limits)
    body |= await asyncio.to_thread(
        limits_view_for, gw.session_factory, caller.tenant_id, gw.settings
    )
    return JSONResponse(body)

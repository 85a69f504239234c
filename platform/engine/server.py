"""The replica's internal HTTP API: stream generations, abort, health, state, metrics.

An `EngineLoop` (engine_loop.py) drives the engine between steps and hands each delta to its
request's stream. A client that disconnects aborts its request at once (a watcher reads the
ASGI `http.disconnect`, streamed or not), which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from loraplex.platform.engine.engine_loop import EngineLoop, PendingAdd
from loraplex.platform.engine.ep_engine import build_engine
from loraplex.platform.engine.metrics import CONTENT_TYPE_LATEST
from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.ports import ServedEngine
from loraplex.platform.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
MAX_PROMPT_TOKENS = 1_000_000


def error_response(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-shaped error body with its status code."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


class GenerateRequest(BaseModel):
    """POST /generate body: a prompt (text or token ids), sampling settings, routing keys."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    prompt_token_ids: list[int] | None = Field(default=None, max_length=MAX_PROMPT_TOKENS)
    request_id: str | None = Field(default=None, max_length=256)
    adapter: Any | None = None
    cache_salt: str | None = Field(default=None, max_length=256)
    stream: bool = True
    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def sampling_params(self) -> SamplingParams:
        """The SamplingParams this body asks for (raises ValueError when invalid)."""
        fields = self.model_dump(
            exclude={"prompt", "prompt_token_ids", "request_id", "adapter", "cache_salt", "stream"}
        )
        return SamplingParams(**fields)


def _lp_json(lps: list[dict[int, float] | None] | None) -> list | None:
    if lps is None:
        return None
    return [
        None if d is None else [{"token_id": t, "logprob": v} for t, v in d.items()] for d in lps
    ]


def delta_json(d: RequestDelta) -> dict[str, Any]:
    """A delta as JSON (logprob dicts become lists, since JSON keys are strings)."""
    out: dict[str, Any] = {
        "request_id": d.request_id,
        "token_ids": d.new_token_ids,
        "text": d.new_text,
        "finished": d.finished,
        "finish_reason": d.finish_reason,
    }
    if d.new_logprobs:
        out["logprobs"] = _lp_json(d.new_logprobs)
    if d.prompt_logprobs is not None:
        out["prompt_logprobs"] = _lp_json(d.prompt_logprobs)
    if d.finished or d.prompt_logprobs is not None:
        out["num_prompt_tokens"] = d.num_prompt_tokens
        out["num_cached_tokens"] = d.num_cached_tokens
    return out


def create_app(core: ServedEngine) -> FastAPI:
    """The FastAPI app serving `core`."""
    holder: dict[str, EngineLoop] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = EngineLoop(core)
        loop.start()
        holder["loop"] = loop
        app.state.engine_loop = loop
        yield
        await loop.stop()

    app = FastAPI(title="loraplex engine", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", [])[1:]) or None
        return error_response(
            400, first.get("msg", "invalid request"), "invalid_request_error", param
        )

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        loop = holder["loop"]
        if (body.prompt is None) == (body.prompt_token_ids is None):
            return error_response(400, "give exactly one of prompt or prompt_token_ids",
                                  "invalid_request_error", "prompt")  # fmt: skip
        try:
            params = body.sampling_params()
        except ValueError as exc:
            return error_response(400, str(exc), "invalid_request_error")
        if params.n != 1:
            return error_response(400, "n must be 1 here", "invalid_request_error", "n")
        rid = body.request_id or f"gen-{uuid.uuid4().hex}"
        prompt = body.prompt if body.prompt is not None else body.prompt_token_ids
        try:
            queue = await loop.add(PendingAdd(prompt, params, rid, body.adapter, body.cache_salt))
        except KeyError:
            return error_response(409, f"request id {rid!r} is in use", "conflict", "request_id")
        except NotImplementedError as exc:
            return error_response(501, str(exc), "not_implemented", "adapter")
        except ValueError as exc:
            return error_response(400, str(exc), "invalid_request_error")
        watcher = asyncio.create_task(_abort_on_disconnect(request, loop, rid))
        if body.stream:
            return _AbortingStream(watcher, _sse(loop, rid, queue), media_type="text/event-stream")
        try:
            return JSONResponse(await _collect(loop, rid, queue))
        finally:
            watcher.cancel()

    @app.post("/abort/{request_id}")
    async def abort(request_id: str) -> Response:
        if not holder["loop"].abort(request_id):
            return error_response(404, f"no running request {request_id!r}", "not_found")
        return JSONResponse({"request_id": request_id, "aborted": True})

    @app.get("/health")
    async def health() -> Response:
        loop = holder.get("loop")
        if loop is None or not loop.alive:
            return error_response(503, "engine loop is not running", "unavailable")
        return JSONResponse({"status": "ok", "last_error": loop.error})

    @app.get("/state")
    async def state() -> Response:
        return JSONResponse(core.state())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(core.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


async def _abort_on_disconnect(request: Request, loop: EngineLoop, rid: str) -> None:
    """Abort `rid` the moment the ASGI server reports the client gone (`http.disconnect`).

    Runs beside the handler (the body is already read, so the next message is the disconnect):
    the abort does not wait for a suspended stream generator to be garbage-collected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    loop.abort(rid)


class _AbortingStream(StreamingResponse):
    """A stream whose disconnect watcher stops, and whose body generator is closed (running
    its abort), when the response ends for any reason."""

    def __init__(self, watcher: asyncio.Task, body: AsyncIterator[str], **kw: Any) -> None:
        super().__init__(body, **kw)
        self._watcher = watcher

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._watcher.cancel()
            await asyncio.shield(self.body_iterator.aclose())  # type: ignore[attr-defined]


async def _next(queue: asyncio.Queue) -> RequestDelta:
    item = await queue.get()
    if isinstance(item, Exception):
        raise item
    return item


async def _sse(loop: EngineLoop, rid: str, queue: asyncio.Queue) -> AsyncIterator[str]:
    finished = False
    try:
        while not finished:
            try:
                d = await _next(queue)
            except Exception as exc:
                err = {"message": str(exc), "type": "server_error", "param": None, "code": 500}
                yield f"data: {json.dumps({'error': err})}\n\n"
                return
            finished = d.finished
            yield f"data: {json.dumps(delta_json(d))}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            loop.abort(rid)


async def _collect(loop: EngineLoop, rid: str, queue: asyncio.Queue) -> dict[str, Any]:
    out: dict[str, Any] = {"request_id": rid, "token_ids": [], "text": "", "logprobs": []}
    finished = False
    try:
        while not finished:
            d = await _next(queue)
            j = delta_json(d)
            out["token_ids"] += j["token_ids"]
            out["text"] += j["text"]
            out["logprobs"] += j.get("logprobs") or []
            for key in ("prompt_logprobs", "num_prompt_tokens", "num_cached_tokens"):
                if key in j:
                    out[key] = j[key]
            finished = d.finished
            out["finish_reason"] = d.finish_reason
    finally:
        if not finished:
            loop.abort(rid)
    return out


def main(argv: list[str] | None = None) -> int:
    """`loraplex engine --model PATH [--host --port ...]`: serve until interrupted.

    The options are EngineConfig's own (`engine_spec.cli`); the object store comes from the
    `LORAPLEX_S3_*` environment (`Settings.storage()`), never from the command line."""
    import sys

    import uvicorn

    from loraplex.platform.engine_spec.cli import parse_engine_args
    from loraplex.platform.settings import Settings

    storage = Settings().storage()
    config, server = parse_engine_args(sys.argv[1:] if argv is None else argv, storage=storage)
    level = getattr(logging, server.log_level.upper(), logging.INFO)
    logging.basicConfig(level=level)  # so the cold-start timeline is logged
    core = build_engine(config)
    if config.ep_size > 1 and config.serves_adapters:
        log.warning("expert parallelism: adapters are not served yet (base model only)")
    elif config.serves_adapters:  # adapters come as AdapterRef objects (object storage)
        from loraplex.loader.object_store import ObjectStore
        from loraplex.platform.engine.lora import LoraRuntime

        core.install_lora_runtime(
            LoraRuntime.for_engine(core, object_store=ObjectStore(storage), allow_local_paths=False)
        )
    try:
        where = (
            {"fd": server.fd}
            if server.fd is not None
            else {"host": server.host, "port": server.port}
        )
        uvicorn.run(create_app(core), log_level=server.log_level, **where)
    finally:
        core.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

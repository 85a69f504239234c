"""The replica's internal HTTP API: stream generations, abort, health, state, metrics.

It speaks the wire format of `loraplex.platform.wire` (one versioned definition the gateway
imports too). An `EngineProcess` (engine_process.py: the engine in a process of its own) or
an `EngineLoop` (engine_loop.py: on a thread of this one) drives the engine between steps and
hands each delta to its request's stream; `wire_mapping.py` turns requests and deltas into engine objects
and wire events. A client that disconnects aborts its request at once (a watcher reads the
ASGI `http.disconnect`), which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.platform.engine.engine_loop import DeltaQueue, EngineLoop, PendingAdd
from loraplex.platform.engine.engine_process import EngineProcess, build_served_engine
from loraplex.platform.engine.metrics import CONTENT_TYPE_LATEST
from loraplex.platform.engine.ports import EngineDriver, ServedEngine
from loraplex.platform.engine.wire_mapping import (
    EventWriter,
    adapter_reference,
    merge_deltas,
)
from loraplex.platform.errors import HttpError
from loraplex.platform.graceful import DrainGuard, serve
from loraplex.platform.http_errors import error_response, install_error_handlers
from loraplex.platform.wire import (
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    AbortResult,
    ErrorEvent,
    ErrorInfo,
    GenerateRequest,
    WarmRequest,
    WarmResult,
    encode_event,
)
from loraplex.platform.wire.auth import authorized

log = logging.getLogger(__name__)
_VERSION = str(WIRE_VERSION).encode()
_HEADER = WIRE_VERSION_HEADER.encode()


class ReplicaGuard:
    """In front of every route but `/health`: the caller must hold the replica secret (else
    401), and speak this wire version (else 400; `/metrics` is exempt from the version, as
    scrapers send none). Every answer carries `x-loraplex-wire`.

    `/health` stays open: liveness probes and the registration heartbeat read it, and it says
    only whether the engine loop runs."""

    OPEN = "/health"
    UNVERSIONED = "/metrics"

    def __init__(self, app: ASGIApp, secret: str) -> None:
        if not secret:
            raise ValueError("a replica needs a secret (LORAPLEX_REPLICA_SECRET)")
        self.app = app
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (_HEADER, _VERSION)]
            await send(message)

        path = scope["path"]
        if path != self.OPEN:
            headers = dict(scope.get("headers", []))
            given = headers.get(b"authorization", b"").decode("latin-1")
            refusal = None
            if not authorized(given, self.secret):
                refusal = error_response(
                    401,
                    "This replica takes requests from the gateway only (replica secret).",
                    code="invalid_replica_secret",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            elif path != self.UNVERSIONED and headers.get(_HEADER) != _VERSION:
                got = (headers.get(_HEADER) or b"none").decode(errors="replace")
                refusal = error_response(
                    400,
                    f"wire version mismatch: this replica speaks {WIRE_VERSION}, the caller {got}",
                    code="wire_version_mismatch",
                )
            if refusal is not None:
                await refusal(scope, receive, stamped)
                return
        await self.app(scope, receive, stamped)


def create_app(engine: ServedEngine | EngineDriver, secret: str) -> FastAPI:
    """The FastAPI app serving `engine` to holders of `secret` (the gateway): an engine
    process (`EngineProcess`, as `main` serves), or an engine to step on a thread of this
    process (wrapped in an `EngineLoop`)."""
    driver: EngineDriver = (
        engine if isinstance(engine, EngineProcess) else EngineLoop(cast(ServedEngine, engine))
    )
    holder: dict[str, EngineDriver] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        driver.start()
        holder["loop"] = driver
        app.state.engine_loop = driver
        yield
        await driver.stop()

    app = FastAPI(title="loraplex engine", lifespan=lifespan)
    app.add_middleware(ReplicaGuard, secret=secret)
    app.add_middleware(DrainGuard)  # outermost: once draining, new requests get 503
    # The platform's one error mapping; the request id is the gateway's, for joint logs.
    install_error_handlers(app, trust_incoming_request_id=True)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        loop = holder["loop"]
        try:
            body = GenerateRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        try:
            add = PendingAdd.of(body)
        except ValueError as exc:
            raise HttpError(400, str(exc), code="invalid_value") from None
        rid = body.request_id
        try:
            queue = await loop.add(add)
        except KeyError:
            raise HttpError(409, f"request id {rid!r} is in use", code="request_id_in_use",
                            param="request_id") from None  # fmt: skip
        except NotImplementedError as exc:
            raise HttpError(501, str(exc), type="invalid_request_error", code="not_implemented",
                            param="adapter") from None  # fmt: skip
        except ValueError as exc:
            raise HttpError(400, str(exc), code="invalid_value") from None
        watcher = asyncio.create_task(_abort_on_disconnect(request, loop, rid))
        writer = EventWriter(loop.tokenizer, add.params.logprobs)
        return _AbortingStream(
            watcher, _sse(loop, rid, queue, writer), media_type="text/event-stream"
        )

    @app.post("/adapters/warm")
    async def warm(request: Request) -> Response:
        try:
            body = WarmRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        try:
            outcome = await holder["loop"].warm(adapter_reference(body.adapter))
        except NotImplementedError as exc:
            raise HttpError(501, str(exc), code="not_implemented", param="adapter") from None
        except ValueError as exc:
            raise HttpError(400, str(exc), code="invalid_value", param="adapter") from None
        return JSONResponse(WarmResult(outcome=outcome).model_dump())  # type: ignore[arg-type]  # a runtime warm outcome; the model checks it

    @app.post("/abort/{request_id}")
    async def abort(request_id: str) -> Response:
        loop = holder["loop"]
        computed = await loop.prompt_tokens_computed(request_id)
        aborted = loop.abort(request_id)
        if not aborted and computed is None:
            raise HttpError(404, f"no running request {request_id!r}", code="not_found")
        result = AbortResult(
            request_id=request_id, aborted=aborted, computed_prompt_tokens=computed or 0
        )
        return JSONResponse(result.model_dump())

    @app.get("/health")
    async def health() -> Response:
        loop = holder.get("loop")
        if loop is None or not loop.alive:
            raise HttpError(503, "engine loop is not running", code="engine_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/state")
    async def state() -> Response:
        return Response(await driver.state_json(), media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await driver.metrics_exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


async def _abort_on_disconnect(request: Request, loop: EngineDriver, rid: str) -> None:
    """Abort `rid` the moment the ASGI server reports the client gone (`http.disconnect`).

    Runs beside the handler (the body is already read, so the next message is the disconnect):
    the abort does not wait for a suspended stream generator to be garbage-collected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    loop.abort(rid)


class _AbortingStream(StreamingResponse):
    """A stream whose disconnect watcher stops, and whose body generator is closed (running
    its abort), when the response ends for any reason."""

    def __init__(self, watcher: asyncio.Task[None], body: AsyncIterator[bytes], **kw: Any) -> None:
        super().__init__(body, **kw)
        self._watcher = watcher

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._watcher.cancel()
            await asyncio.shield(self.body_iterator.aclose())  # type: ignore[attr-defined]  # an async generator here


async def _sse(
    loop: EngineDriver, rid: str, queue: DeltaQueue, writer: EventWriter
) -> AsyncIterator[bytes]:
    """The `/generate` stream: delta frames, then a finish frame (or an error frame). Deltas
    that queued up while the stream waited on its client leave together, as one frame."""
    finished = False
    try:
        while not finished:
            items = [await queue.get()]
            while not queue.empty() and not isinstance(items[-1], Exception):
                items.append(queue.get_nowait())  # the steps' deltas that piled up meanwhile
            failure = next((i for i in items if isinstance(i, Exception)), None)
            deltas = [i for i in items if not isinstance(i, Exception)]
            if deltas:
                delta = merge_deltas(deltas)
                finished = delta.finished
                yield b"".join(writer.frames(delta))
            if failure is not None and not finished:
                info = ErrorInfo(message=f"engine step failed: {failure}", type="server_error",
                                 code="engine_error")  # fmt: skip
                yield encode_event(ErrorEvent(error=info))
                return
    finally:
        if not finished:
            loop.abort(rid)


def main(argv: list[str] | None = None) -> int:
    """`loraplex engine --model PATH [--host --port ...]`: serve until interrupted.

    The options are EngineConfig's own (`engine_spec.cli`); the object store comes from the
    `LORAPLEX_S3_*` environment (`Settings.storage()`), never from the command line."""
    import sys

    from loraplex.platform.engine_spec.cli import parse_engine_args
    from loraplex.platform.settings import Settings

    settings = Settings()
    storage = settings.storage()
    config, server = parse_engine_args(sys.argv[1:] if argv is None else argv, storage=storage)
    level = getattr(logging, server.log_level.upper(), logging.INFO)
    logging.basicConfig(level=level)  # so the cold-start timeline is logged
    settings = Settings()
    if not settings.replica_secret:
        raise SystemExit(
            "loraplex engine: set LORAPLEX_REPLICA_SECRET (the gateway's shared secret; "
            "`loraplex up` keeps one in its data dir)"
        )
    if config.ep_size > 1:  # the group's processes live beside this server
        engine: ServedEngine | EngineDriver = build_served_engine(config, storage)
    else:  # the engine steps in a process of its own: no GIL shared with the HTTP server
        engine = EngineProcess(config, storage)
        engine.launch()
    try:
        app = create_app(engine, settings.replica_secret)
        if server.fd is not None:
            where: dict[str, Any] = {"fd": server.fd}
        else:  # the replica API is for the gateway: an internal address, never the public one
            where = {"host": server.host or settings.replica_host, "port": server.port}
        # SIGTERM: stop taking requests, finish the running ones, exit 0.
        serve(app, log_level=server.log_level, drain_timeout_s=settings.drain_timeout_s, **where)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

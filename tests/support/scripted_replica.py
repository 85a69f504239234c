"""A scripted replica for router unit tests: a real HTTP server (uvicorn on a free port)
speaking the wire format (`loraplex.platform.wire`, requests validated) with canned tokens,
that can be told to fail before or after its first token. The real engine replica is
exercised end to end in tests/api."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from loraplex.platform.embedded.process import listen_socket
from loraplex.platform.wire import (
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    AbortResult,
    DeltaEvent,
    FinishEvent,
    GenerateRequest,
    ReplicaState,
    Usage,
    encode_event,
)
from loraplex.platform.wire.auth import authorized


def replica_state(**fields: Any) -> ReplicaState:
    """An idle replica's `/state` with `fields` changed."""
    doc: dict[str, Any] = dict(
        wire_version=WIRE_VERSION, model_id="m", block_size=16, prefix_caching=True,
        num_blocks=100, num_free_blocks=100, kv_cache_usage=0.0, num_requests_running=0,
        num_requests_waiting=0, resident_adapters=[], max_loras=4, prefix_cache_queries=0,
        prefix_cache_hits=0, num_preemptions=0,
    )  # fmt: skip
    doc.update(fields)
    return ReplicaState(**doc)


def register_url(redis_url: str, deployment: str, url: str) -> None:
    """Register `url` in the gateway's replica registry as a live replica of `deployment`
    (for ten minutes: long enough for any test)."""
    from redis.asyncio import Redis

    from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry

    async def register() -> None:
        redis = Redis.from_url(redis_url)
        try:
            await ReplicaRegistry(redis).register(ReplicaInfo(deployment, url), ttl_s=600)
        finally:
            await redis.aclose()

    asyncio.run(register())


def refusing_url() -> tuple[str, socket.socket]:
    """A URL where connections are refused for as long as the returned socket stays open (bound,
    never listening: no other process can take the port meanwhile)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return f"http://127.0.0.1:{sock.getsockname()[1]}", sock


class ScriptedReplica:
    """Serves `tokens` one per `delay_s`; `fail` is None, "before" (500) or "after" (drops)."""

    def __init__(
        self,
        tokens: list[int],
        *,
        state: ReplicaState | None = None,
        delay_s: float = 0.0,
        fail: str | None = None,
        version: str = str(WIRE_VERSION),
        extra_field: bool = False,
        computed_prompt_tokens: int = 0,
    ) -> None:
        """`version` is the wire version it claims; `extra_field` adds a field the wire does
        not know to each delta (both are protocol errors for the gateway)."""
        self.tokens, self.delay_s, self.fail = tokens, delay_s, fail
        self.headers = {WIRE_VERSION_HEADER: version}
        self.extra_field = extra_field
        self.computed_prompt_tokens = computed_prompt_tokens
        """What `/abort` says the engine had computed of the prompt."""
        self.state_doc = state or replica_state()
        self.state_calls = 0
        self.state_delay_s = 0.0
        """Seconds `/state` takes to answer (a busy replica answers late, yet answers)."""
        self.requests: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self._sock = listen_socket()  # ours from the start: no port race
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                Route("/generate", self._generate, methods=["POST"]),
                Route("/abort/{rid}", self._abort, methods=["POST"]),
                Route("/state", self._state, methods=["GET"]),
            ]
        )
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def _refused(self, request: Request) -> Response | None:
        if authorized(request.headers.get("authorization"), os.environ["LORAPLEX_REPLICA_SECRET"]):
            return None
        return JSONResponse({"error": {"message": "no", "type": "x", "param": None,
                                       "code": "invalid_replica_secret"}},
                            status_code=401, headers=self.headers)  # fmt: skip

    async def _generate(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        body = GenerateRequest.model_validate_json(await request.body())
        self.requests.append(body)
        if self.fail == "before":
            return JSONResponse({"error": {"message": "engine crashed"}}, status_code=500)

        async def stream():
            for i, t in enumerate(self.tokens):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.fail == "after" and i == 2:
                    raise RuntimeError("replica died mid-stream")
                frame = encode_event(DeltaEvent(token_ids=[t], text=f"<{t}>"))
                if self.extra_field:
                    frame = frame.replace(b'{"type"', b'{"new_token_ids":[1],"type"')
                yield frame
            usage = Usage(
                prompt_tokens=len(body.prompt_token_ids),
                completion_tokens=len(self.tokens),
                cached_tokens=0,
            )
            yield encode_event(FinishEvent(finish_reason="length", usage=usage))

        return StreamingResponse(stream(), media_type="text/event-stream", headers=self.headers)

    async def _abort(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        self.aborted.append(request.path_params["rid"])
        result = AbortResult(
            request_id=request.path_params["rid"],
            aborted=True,
            computed_prompt_tokens=self.computed_prompt_tokens,
        )
        return JSONResponse(result.model_dump(), headers=self.headers)

    async def _state(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        self.state_calls += 1
        if self.state_delay_s:
            await asyncio.sleep(self.state_delay_s)
        return Response(self.state_doc.model_dump_json(), media_type="application/json",
                        headers=self.headers)  # fmt: skip

    def __enter__(self) -> ScriptedReplica:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted replica did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()

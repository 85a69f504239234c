"""A scripted replica for router unit tests: a real HTTP server (uvicorn on a free port)
speaking the replica protocol with canned tokens, that can be told to fail before or after
its first token. The real engine replica is exercised end to end in tests/api."""

from __future__ import annotations

import asyncio
import json
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
        state: dict[str, Any] | None = None,
        delay_s: float = 0.0,
        fail: str | None = None,
    ) -> None:
        self.tokens, self.delay_s, self.fail = tokens, delay_s, fail
        self.state_doc = state or {}
        self.requests: list[dict[str, Any]] = []
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

    async def _generate(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        if self.fail == "before":
            return JSONResponse({"error": {"message": "engine crashed"}}, status_code=500)

        async def stream():
            for i, t in enumerate(self.tokens):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.fail == "after" and i == 2:
                    raise RuntimeError("replica died mid-stream")
                last = i == len(self.tokens) - 1
                event = {
                    "request_id": body["request_id"],
                    "token_ids": [t],
                    "text": "",
                    "finished": last,
                    "finish_reason": "length" if last else None,
                    "num_prompt_tokens": len(body["prompt_token_ids"]),
                    "num_cached_tokens": 0,
                }
                yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def _abort(self, request: Request) -> Response:
        self.aborted.append(request.path_params["rid"])
        return JSONResponse({"aborted": True})

    async def _state(self, request: Request) -> Response:
        return JSONResponse(self.state_doc)

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

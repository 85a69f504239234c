"""The replica HTTP API on a real uvicorn server: stream, abort on disconnect, errors, metrics."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine.server import create_app  # noqa: E402
from loraplex.platform.engine_spec.cli import parse_engine_args  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402
from loraplex.platform.testing.models import save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineCore]]:
    import uvicorn

    from loraplex.platform.embedded.process import listen_socket

    path = tmp_path_factory.mktemp("srv")
    save_tiny_model(path, "llama", max_position_embeddings=4096)
    core = EngineCore(EngineConfig(str(path), block_size=8, max_num_batched_tokens=64))
    sock = listen_socket()  # bound before the server starts: no port race
    srv = uvicorn.Server(uvicorn.Config(create_app(core), log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 60
    while True:  # the tests must not run against a server that never came up
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if not thread.is_alive() or time.monotonic() > deadline:
            srv.should_exit = True
            sock.close()
            pytest.fail(f"the engine server at {url} never became healthy")
        time.sleep(0.05)
    yield url, core
    srv.should_exit = True
    thread.join(timeout=10)
    sock.close()


def events(resp: httpx.Response) -> Iterator[dict | str]:
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def wait_idle(url: str, timeout: float = 5.0) -> dict:
    deadline = time.time() + timeout
    while True:
        state = httpx.get(url + "/state").json()
        if state["num_requests_running"] == 0 and state["num_requests_waiting"] == 0:
            return state
        assert time.time() < deadline, state
        time.sleep(0.02)


def test_stream_generation(server: tuple[str, EngineCore]) -> None:
    url, _ = server
    body = {"prompt": "hello there", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "logprobs": 2}  # fmt: skip
    with httpx.stream("POST", url + "/generate", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        got = list(events(resp))
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    tokens = [t for c in chunks for t in c["token_ids"]]
    assert len(tokens) == 12 and chunks[-1]["finish_reason"] == "length"
    assert all(len(c["logprobs"][0]) >= 2 for c in chunks)
    whole = httpx.post(url + "/generate", json={**body, "stream": False}, timeout=30).json()
    assert whole["token_ids"] == tokens
    assert whole["text"] == "".join(c["text"] for c in chunks)


def test_client_disconnect_aborts_and_frees_blocks(server: tuple[str, EngineCore]) -> None:
    url, core = server
    body = {"prompt_token_ids": list(range(3, 40)), "max_tokens": 4000, "ignore_eos": True,
            "request_id": "leaver"}  # fmt: skip
    with httpx.stream("POST", url + "/generate", json=body, timeout=30) as resp:
        it = events(resp)
        first = next(it)
        next(it)
        assert first["request_id"] == "leaver"
        assert httpx.get(url + "/state").json()["num_requests_running"] == 1
    state = wait_idle(url)
    assert state["num_free_blocks"] == state["num_blocks"]
    metrics = httpx.get(url + "/metrics").text
    assert 'finished_reason="abort"' in metrics
    assert core.scheduler.requests == {}


def test_abort_endpoint_ends_stream(server: tuple[str, EngineCore]) -> None:
    url, _ = server
    body = {"prompt_token_ids": [5, 6, 7], "max_tokens": 4000, "ignore_eos": True,
            "request_id": "victim"}  # fmt: skip
    with httpx.stream("POST", url + "/generate", json=body, timeout=30) as resp:
        it = events(resp)
        next(it)
        assert httpx.post(url + "/abort/victim").json() == {"request_id": "victim", "aborted": True}
        rest = list(it)
    assert rest[-1] == "[DONE]" and rest[-2]["finish_reason"] == "abort"
    assert httpx.post(url + "/abort/victim").status_code == 404
    wait_idle(url)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"max_tokens": 3}, 400, "prompt"),
        ({"prompt": "a", "prompt_token_ids": [1]}, 400, "prompt"),
        ({"prompt": "a", "temperature": -1}, 400, None),
        ({"prompt": "a", "max_tokens": "many"}, 400, "max_tokens"),
        ({"prompt": "a", "bogus": 1}, 400, "bogus"),
        ({"prompt_token_ids": [1, 10**9]}, 400, None),
        ({"prompt": "a", "adapter": "tenant/x"}, 501, "adapter"),
    ],
)
def test_bad_requests_get_openai_errors(
    server: tuple[str, EngineCore], body: dict, status: int, param: str | None
) -> None:
    url, _ = server
    resp = httpx.post(url + "/generate", json=body, timeout=30)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param


def test_health_state_and_metrics_names(server: tuple[str, EngineCore]) -> None:
    url, _ = server
    assert httpx.get(url + "/health").json()["status"] == "ok"
    state = httpx.get(url + "/state").json()
    for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                "num_free_blocks", "resident_adapters"):  # fmt: skip
        assert key in state
    httpx.post(url + "/generate", json={"prompt": "abc", "max_tokens": 3, "stream": False})
    text = httpx.get(url + "/metrics").text
    for name in (
        "loraplex:time_to_first_token_seconds_bucket",
        "loraplex:inter_token_latency_seconds_bucket",
        "loraplex:e2e_request_latency_seconds_bucket",
        "loraplex:num_requests_running",
        "loraplex:num_requests_waiting",
        "loraplex:kv_cache_usage_perc",
        "loraplex:prefix_cache_queries_total",
        "loraplex:prefix_cache_hits_total",
        "loraplex:num_preemptions_total",
        "loraplex:prompt_tokens_total",
        "loraplex:generation_tokens_total",
    ):
        assert name in text, name


def test_cli_arguments_build_config(tmp_path) -> None:
    cfg, server = parse_engine_args(
        ["--model", str(tmp_path), "--port", "9", "--no-enable-chunked-prefill",
         "--max-num-seqs", "4"]
    )  # fmt: skip
    assert (cfg.enable_chunked_prefill, cfg.max_num_seqs, cfg.enable_prefix_caching) == (
        False,
        4,
        True,
    )
    assert server.port == 9


def test_concurrent_streams_each_get_their_own_tokens(server: tuple[str, EngineCore]) -> None:
    import asyncio

    url, _ = server
    prompts = [list(range(3 + i, 10 + 2 * i)) for i in range(6)]
    base = {"max_tokens": 10, "temperature": 0, "ignore_eos": True, "stream": False}
    alone = [
        httpx.post(url + "/generate", json={**base, "prompt_token_ids": p}, timeout=30).json()
        for p in prompts
    ]

    async def one(client: httpx.AsyncClient, p: list[int]) -> list[int]:
        body = {**base, "prompt_token_ids": p, "stream": True}
        tokens: list[int] = []
        async with client.stream("POST", url + "/generate", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    tokens += json.loads(line[6:])["token_ids"]
        return tokens

    async def all_at_once() -> list[list[int]]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    together = asyncio.run(all_at_once())
    assert together == [a["token_ids"] for a in alone]
    wait_idle(url)

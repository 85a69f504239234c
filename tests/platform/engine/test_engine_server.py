"""The replica HTTP API on a real uvicorn server, in the wire format (`loraplex.platform.wire`):
stream, abort on disconnect, errors, state and metrics."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.replica_wire import HEADERS, SECRET, body, generate  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine.server import create_app  # noqa: E402
from loraplex.platform.engine_spec.cli import parse_engine_args  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402
from loraplex.platform.wire import (  # noqa: E402
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    DeltaEvent,
    FinishEvent,
    ReplicaState,
    decode_event,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineCore]]:
    import uvicorn

    from loraplex.platform.embedded.process import listen_socket

    path = tmp_path_factory.mktemp("srv")
    save_tiny_model(path, "llama", max_position_embeddings=4096)
    core = EngineCore(EngineConfig(str(path), block_size=8, max_num_batched_tokens=64))
    sock = listen_socket()  # bound before the server starts: no port race
    srv = uvicorn.Server(uvicorn.Config(create_app(core, SECRET), log_level="warning"))
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


def events(resp: httpx.Response) -> Iterator[DeltaEvent | FinishEvent]:
    for line in resp.iter_lines():
        if line:
            assert line.startswith("data: "), line
            yield decode_event(line[len("data: ") :])


def state(url: str) -> ReplicaState:
    return ReplicaState.model_validate_json(httpx.get(url + "/state", headers=HEADERS).content)


def wait_idle(url: str, timeout: float = 5.0) -> ReplicaState:
    deadline = time.time() + timeout
    while True:
        s = state(url)
        if s.num_requests_running == 0 and s.num_requests_waiting == 0:
            return s
        assert time.time() < deadline, s
        time.sleep(0.02)


def test_stream_generation(server: tuple[str, EngineCore]) -> None:
    url, core = server
    ids = core.tokenizer.encode("hello there")
    got = generate(url, body(ids, max_tokens=12, temperature=0, ignore_eos=True, logprobs=2))
    deltas, finish = got.events[:-1], got.finish
    assert isinstance(finish, FinishEvent) and finish.finish_reason == "length"
    assert all(isinstance(d, DeltaEvent) for d in deltas)
    tokens = [t for d in deltas for t in d.token_ids]
    assert len(tokens) == 12 and finish.usage.completion_tokens == 12
    assert finish.usage.prompt_tokens == len(ids)
    assert all(len(lp.top) == 2 for d in deltas for lp in d.logprobs or [])
    assert "".join(d.text for d in deltas) == core.tokenizer.decode(tokens)


def test_client_disconnect_aborts_and_frees_blocks(server: tuple[str, EngineCore]) -> None:
    url, core = server
    req = body(list(range(3, 40)), "leaver", max_tokens=4000, ignore_eos=True)
    with httpx.stream("POST", url + "/generate", json=req, headers=HEADERS, timeout=30) as resp:
        it = events(resp)
        next(it)
        next(it)
        assert state(url).num_requests_running == 1
    s = wait_idle(url)
    assert s.num_free_blocks == s.num_blocks
    metrics = httpx.get(url + "/metrics", headers=HEADERS).text
    assert 'finished_reason="abort"' in metrics
    assert core.scheduler.requests == {}


def test_abort_endpoint_ends_stream(server: tuple[str, EngineCore]) -> None:
    url, _ = server
    req = body([5, 6, 7], "victim", max_tokens=4000, ignore_eos=True)
    with httpx.stream("POST", url + "/generate", json=req, headers=HEADERS, timeout=30) as resp:
        it = events(resp)
        next(it)
        aborted = httpx.post(url + "/abort/victim", headers=HEADERS)
        assert aborted.json() == {
            "request_id": "victim",
            "aborted": True,
            "computed_prompt_tokens": 3,
        }
        rest = list(it)
    assert isinstance(rest[-1], FinishEvent) and rest[-1].finish_reason == "abort"
    again = httpx.post(url + "/abort/victim", headers=HEADERS)  # gone, its count kept a while
    assert again.json() == {"request_id": "victim", "aborted": False, "computed_prompt_tokens": 3}
    assert httpx.post(url + "/abort/never-was", headers=HEADERS).status_code == 404
    wait_idle(url)


def test_abort_before_the_first_token_reports_the_prefill_done(
    server: tuple[str, EngineCore],
) -> None:
    """A client that leaves mid-prefill is metered for what was computed: the abort answers
    with the prompt tokens the engine ran (whole chunks of the step budget, 64 here), and a
    later abort (the gateway's, after the replica saw the disconnect) with the same count."""
    url, _ = server
    prompt = [(7 * i) % 120 + 3 for i in range(3000)]
    req = body(prompt, "early-leaver", max_tokens=1000, ignore_eos=True)
    with httpx.stream("POST", url + "/generate", json=req, headers=HEADERS, timeout=30):
        first = httpx.post(url + "/abort/early-leaver", headers=HEADERS).json()
    assert first["aborted"] is True, first
    computed = first["computed_prompt_tokens"]
    # Whole chunks of the step budget while the prefill runs (all of it once it is done).
    assert 0 <= computed <= 3000 and (computed % 64 == 0 or computed == 3000), computed
    time.sleep(0.3)
    later = httpx.post(url + "/abort/early-leaver", headers=HEADERS).json()
    assert later["aborted"] is False and later["computed_prompt_tokens"] >= computed
    wait_idle(url)


@pytest.mark.parametrize(
    ("req", "status", "param"),
    [
        ({"request_id": "x", "sampling": {"max_tokens": 3}}, 422, "prompt_token_ids"),
        ({**body([1]), "prompt": "a"}, 422, "prompt"),  # text prompts: the gateway tokenizes
        (body([1], temperature=-1), 400, None),
        (body([1], max_tokens="many"), 422, "sampling.max_tokens"),
        (body([1], max_tokens="3"), 422, "sampling.max_tokens"),  # no coercion
        ({**body([1]), "bogus": 1}, 422, "bogus"),
        (body([1], n=2), 422, "sampling.n"),
        (body([1, 10**9]), 400, None),
        ({**body([1]), "adapter": "tenant/x"}, 422, "adapter"),
        ({**body([1]), "adapter": {"object_prefix": "p/", "sha256": "ab" * 32}}, 501, "adapter"),
    ],
)
def test_bad_requests_get_openai_errors(
    server: tuple[str, EngineCore], req: dict, status: int, param: str | None
) -> None:
    url, _ = server
    resp = httpx.post(url + "/generate", json=req, headers=HEADERS, timeout=30)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert isinstance(err["code"], str)
    if param is not None:
        assert err["param"] == param


def test_only_the_gateway_is_served(server: tuple[str, EngineCore]) -> None:
    """Without the replica secret (or with another) every route but /health is refused."""
    url, _ = server
    version = {WIRE_VERSION_HEADER: str(WIRE_VERSION)}
    for headers in (version, {**version, "authorization": "Bearer not-the-secret"},
                    {**version, "authorization": SECRET}):  # fmt: skip
        for resp in (
            httpx.post(url + "/generate", json=body([1, 2, 3], max_tokens=2), headers=headers),
            httpx.post(url + "/abort/x", headers=headers),
            httpx.get(url + "/state", headers=headers),
            httpx.get(url + "/metrics", headers=headers),
        ):
            assert resp.status_code == 401, (resp.request.url, resp.text)
            assert resp.json()["error"]["code"] == "invalid_replica_secret"
    assert httpx.get(url + "/health").status_code == 200  # probes need no secret
    assert httpx.get(
        url + "/metrics", headers={"authorization": HEADERS["authorization"]}
    ).is_success


def test_another_wire_version_is_refused(server: tuple[str, EngineCore]) -> None:
    url, _ = server
    auth = {"authorization": HEADERS["authorization"]}
    for headers in (auth, {**auth, WIRE_VERSION_HEADER: str(WIRE_VERSION + 1)}):
        for resp in (
            httpx.post(url + "/generate", json=body([1]), headers=headers),
            httpx.get(url + "/state", headers=headers),
        ):
            assert resp.status_code == 400
            assert resp.json()["error"]["code"] == "wire_version_mismatch"


def test_health_state_and_metrics_names(server: tuple[str, EngineCore]) -> None:
    url, core = server
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    s = state(url)
    assert s.block_size == 8 and s.model_id == core.model_id and s.prefix_caching
    assert 0.0 <= s.kv_cache_usage <= 1.0
    generate(url, body([3, 4, 5], max_tokens=3))
    text = httpx.get(url + "/metrics", headers=HEADERS).text
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
    opts = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
    alone = [generate(url, body(p, f"a{i}", **opts)).token_ids for i, p in enumerate(prompts)]

    async def one(client: httpx.AsyncClient, i: int, p: list[int]) -> list[int]:
        tokens: list[int] = []
        req = body(p, f"c{i}", **opts)
        async with client.stream("POST", url + "/generate", json=req, headers=HEADERS) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    tokens += event.get("token_ids", [])
        return tokens

    async def all_at_once() -> list[list[int]]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, i, p) for i, p in enumerate(prompts)))

    together = asyncio.run(all_at_once())
    assert together == alone
    wait_idle(url)


def test_gateway_client_round_trip(server: tuple[str, EngineCore]) -> None:
    """The gateway's own client against the real replica: the request is validated by the
    replica, every answer (state, events, abort) by the client, both with the wire models."""
    import asyncio

    from loraplex.platform.gateway.replica_client import ReplicaClient
    from loraplex.platform.wire import GenerateRequest, SamplingOptions

    url, core = server
    req = GenerateRequest(
        request_id="round-trip",
        prompt_token_ids=core.tokenizer.encode("round trip"),
        sampling=SamplingOptions(max_tokens=5, temperature=0, ignore_eos=True, logprobs=1),
    )

    async def run() -> tuple[ReplicaState, list[DeltaEvent | FinishEvent]]:
        async with httpx.AsyncClient() as http:
            client = ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"])
            events = [e async for e in client.generate(url, req)]
            await client.abort(url, "round-trip")  # already finished: a 404, ignored
            return await client.state(url), events

    st, got = asyncio.run(run())
    assert st.block_size == 8 and st.num_requests_running == 0
    assert isinstance(got[-1], FinishEvent) and got[-1].usage.completion_tokens == 5
    tokens = [t for e in got[:-1] for t in e.token_ids]
    assert len(tokens) == 5 and all(len(e.logprobs or []) == len(e.token_ids) for e in got[:-1])
    assert "".join(e.text for e in got[:-1]) == core.tokenizer.decode(tokens)

"""The replica's engine in a process of its own (`EngineProcess`): the HTTP server streams what
the engine computes in the child (greedy tokens equal to the engine run offline), answers
`/state`, `/metrics` and aborts through it, reports a child that cannot start with the child's
error, and ends live streams with an error (and `/health` with 503) when the child dies."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.replica_wire import HEADERS, SECRET, body  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.engine_process import (  # noqa: E402
    ENGINE_NICE,
    EngineProcess,
    EngineProcessFailed,
)
from loraplex.platform.engine.server import create_app  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402
from loraplex.platform.wire import (  # noqa: E402
    DeltaEvent,
    ErrorEvent,
    FinishEvent,
    ReplicaState,
    decode_event,
)

PROMPT = [5, 9, 14, 3, 22, 7]


def _config(path: Path) -> EngineConfig:
    return EngineConfig(str(path), block_size=8, max_num_batched_tokens=64, cpu_threads=1)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("proc")
    save_tiny_model(path, "llama", max_position_embeddings=4096)
    return path


def _serve(engine: EngineProcess) -> tuple[str, object, threading.Thread]:
    import uvicorn

    from loraplex.platform.embedded.process import listen_socket

    sock = listen_socket()
    srv = uvicorn.Server(uvicorn.Config(create_app(engine, SECRET), log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return url, srv, thread
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("the server never became healthy")


def _stream(url: str, max_tokens: int, rid: str, out: list | None = None) -> list:
    """The stream's events, appended to `out` as they arrive."""
    out = [] if out is None else out
    req = body(PROMPT, rid, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with httpx.stream("POST", url + "/generate", json=req, headers=HEADERS, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(decode_event(line[len("data: ") :]))
    return out


def test_the_engine_steps_in_its_own_process_and_matches_offline(model: Path) -> None:
    engine = EngineProcess(_config(model))
    engine.launch()
    url, srv, thread = _serve(engine)
    try:
        children = [p for p in multiprocessing.active_children() if p.name == "loraplex-engine"]
        assert len(children) == 1 and children[0].pid != os.getpid()
        # below the server's priority: where they share a core, the server's work goes first
        assert os.getpriority(os.PRIO_PROCESS, children[0].pid) == os.nice(0) + ENGINE_NICE
        got = _stream(url, 12, "p-1")
        tokens = [t for e in got if isinstance(e, DeltaEvent) for t in e.token_ids]
        assert isinstance(got[-1], FinishEvent)
        want = (
            LLM(str(model))
            .generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
            .outputs[0]
            .token_ids
        )
        assert tokens == list(want)
        state = ReplicaState.model_validate_json(httpx.get(url + "/state", headers=HEADERS).content)
        assert state.num_requests_running == 0 and state.block_size == 8
        metrics = httpx.get(url + "/metrics", headers=HEADERS).text
        assert "loraplex" in metrics or "vllm" in metrics
        r = httpx.post(url + "/abort/nope", headers=HEADERS)
        assert r.status_code == 404
    finally:
        srv.should_exit = True  # type: ignore[attr-defined]
        thread.join(timeout=30)
        engine.close()
    assert not engine._proc.is_alive()  # stopped with the server


def test_an_engine_that_cannot_start_says_why(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    engine = EngineProcess(_config(tmp_path))
    with pytest.raises(EngineProcessFailed) as info:
        engine.launch()
    assert "could not start" in str(info.value) and "UnsupportedArchitectureError" in str(
        info.value
    )


def test_a_dead_engine_ends_its_streams_and_fails_health(model: Path) -> None:
    engine = EngineProcess(_config(model))
    engine.launch()
    url, srv, thread = _serve(engine)
    try:
        got: list = []
        reader = threading.Thread(target=_stream, args=(url, 4000, "p-2", got))
        reader.start()
        deadline = time.monotonic() + 30
        while not any(isinstance(e, DeltaEvent) for e in got) and time.monotonic() < deadline:
            time.sleep(0.01)
        engine._proc.kill()
        reader.join(timeout=30)
        assert not reader.is_alive()
        assert isinstance(got[-1], ErrorEvent) and "engine" in got[-1].error.message, got[-1:]
        assert httpx.get(url + "/health").status_code == 503
    finally:
        srv.should_exit = True  # type: ignore[attr-defined]
        thread.join(timeout=30)
        engine.close()

"""A client that leaves `/generate` has its request aborted at once on a real uvicorn server,
called directly (no gateway): `/state` shows it gone and every KV block free within a short
time, and it finishes as `abort`, not by running to `max_tokens`."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.replica_wire import HEADERS, SECRET  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine.server import create_app  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

LONG = 4000  # tokens: far more than the test waits for


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import uvicorn

    path = tmp_path_factory.mktemp("srvdc")
    save_tiny_model(path, "llama", max_position_embeddings=4096)
    core = EngineCore(EngineConfig(str(path), block_size=8, max_num_batched_tokens=64))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(core, SECRET), port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the replica never started"
        time.sleep(0.05)
    yield base
    srv.should_exit = True
    thread.join(timeout=10)


def _aborted(url: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(url + "/metrics", headers=HEADERS).text.splitlines()
        if "request_success_total{" in line and 'finished_reason="abort"' in line
    )


def _gone_within(url: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        state = httpx.get(url + "/state", headers=HEADERS).json()
        if (
            state["num_requests_running"] == 0
            and state["num_requests_waiting"] == 0
            and state["num_free_blocks"] == state["num_blocks"]
        ):
            return state
        assert time.monotonic() < deadline, f"request still there after {seconds}s: {state}"
        time.sleep(0.02)


def _body(rid: str, max_tokens: int = LONG) -> dict:
    return {"request_id": rid, "prompt_token_ids": list(range(3, 30)),
            "sampling": {"max_tokens": max_tokens, "ignore_eos": True}}  # fmt: skip


def test_streamed_request_is_aborted_when_the_client_leaves(url: str) -> None:
    before = _aborted(url)
    with httpx.stream(
        "POST", url + "/generate", json=_body("leaver"), headers=HEADERS, timeout=30
    ) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        assert httpx.get(url + "/state", headers=HEADERS).json()["num_requests_running"] == 1
    _gone_within(url, 1.5)
    assert _aborted(url) == before + 1


def test_finished_requests_are_not_aborted(url: str) -> None:
    before = _aborted(url)
    resp = httpx.post(url + "/generate", json=_body("stays", 3), headers=HEADERS, timeout=30)
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line]
    assert sum(len(e.get("token_ids", [])) for e in events) == 3
    assert events[-1]["type"] == "finish" and events[-1]["finish_reason"] == "length"
    assert _aborted(url) == before

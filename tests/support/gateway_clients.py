"""Client-side helpers for the gateway end-to-end tests: concurrent stream clients, waiting
for a replica to go idle, and reading its abort counter."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from support.gateway_stack import WIRE_HEADERS, Replica

MESSAGES = [{"role": "user", "content": "Hello! How are you today?"}]


def wait_idle(replica: Replica, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = replica.state()
        if (
            state["num_requests_running"] == 0
            and state["num_requests_waiting"] == 0
            and state["kv_cache_usage"] == 0
        ):
            return state
        time.sleep(0.1)
    raise AssertionError(f"replica not idle: {state}")


def stream_worker(url: str, key: str, model: str, mode: str, out: dict[str, Any]) -> None:
    """One client: reads all ('full'), disconnects after 2 events ('drop'), or reads slowly."""
    body = {
        "model": model,
        "messages": MESSAGES,
        # A dropped stream asks for far more than it reads: only an abort frees it quickly.
        "max_tokens": 1500 if mode == "drop" else 40,
        "stream": True,
        "temperature": 1.0,
        "seed": 1,
    }
    events = 0
    try:
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {key}"},
        ) as r:
            out["status"] = r.status_code
            if r.status_code != 200:
                out["body"] = r.read().decode()[:500]
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                events += 1
                if line == "data: [DONE]":
                    out["done"] = True
                if mode == "drop" and events == 2:
                    break
                if mode == "slow":
                    time.sleep(0.15)
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    out["events"] = events


def run_clients(stack: Any, models: list[str]) -> list[dict[str, Any]]:
    outs: list[dict[str, Any]] = [{} for _ in range(20)]
    modes = ["full", "drop", "slow", "full"] * 5
    threads = [
        threading.Thread(
            target=stream_worker,
            args=(stack.api.url, stack.key_a, models[i % len(models)], modes[i], outs[i]),
        )
        for i in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client hung"
    for mode, out in zip(modes, outs, strict=True):
        assert out.get("status") == 200, out
        if mode in ("full", "slow"):
            assert out.get("done"), out
    return outs


def aborted_count(replica: Replica) -> float:
    text = httpx.get(f"{replica.url}/metrics", headers=WIRE_HEADERS, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if "request_success_total{" in line and 'finished_reason="abort"' in line
    )

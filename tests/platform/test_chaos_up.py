"""Chaos under `loraplex up`: steady streaming load over several adapters while the replica,
the worker, Redis, SeaweedFS and PostgreSQL are each killed -9 in turn and brought back by the
supervisor. Afterwards: no client hung (every request finished or failed before its deadline),
no version stuck in `validating`, usage neither lost nor double-counted for the requests that
completed, and serving resumed within RECOVERY_BOUND_S of each kill. Prints a table: fault,
requests affected, time to recover."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.up_process import UpProcess, restarted, supervised

from loraplex.bench._synthetic.adapters import write_random_adapter
from loraplex.bench.serve_stack import upload_and_wait
from loraplex.platform.demo_model import make_demo_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
FAULTS = ("engine replica", "worker", "Redis", "SeaweedFS S3", "PostgreSQL")
ADAPTERS = 3
CLIENTS = 4
MAX_TOKENS = 8
REQUEST_DEADLINE_S = 60.0  # a request still open after this has hung
RECOVERY_BOUND_S = 120.0  # from the kill to the first request served again


@dataclass
class Outcome:
    """One client request: when it ran, and how it ended."""

    start: float
    end: float
    ok: bool
    tokens: int = 0
    error: str = ""


def _stream_once(client: httpx.Client, url: str, key: str, model: str) -> Outcome:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.monotonic()
    tokens, done = None, False
    try:
        with client.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            if resp.status_code != 200:
                resp.read()
                return Outcome(start, time.monotonic(), False, error=f"HTTP {resp.status_code}")
            for line in resp.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return Outcome(start, time.monotonic(), False, error="stream error")
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
    except httpx.TimeoutException as exc:
        return Outcome(start, time.monotonic(), False, error=f"HUNG {type(exc).__name__}")
    except httpx.HTTPError as exc:
        return Outcome(start, time.monotonic(), False, error=type(exc).__name__)
    ok = done and tokens is not None
    return Outcome(start, time.monotonic(), ok, tokens or 0, "" if ok else "truncated")


class Load:
    """CLIENTS threads streaming back to back over the adapters until stopped."""

    def __init__(self, url: str, key: str, models: list[str]) -> None:
        self.url, self.key, self.models = url, key, models
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]
        for t in self._threads:
            t.start()

    def _run(self, idx: int) -> None:
        timeout = httpx.Timeout(REQUEST_DEADLINE_S, connect=10)
        with httpx.Client(timeout=timeout) as client:
            n = idx
            while not self._stop.is_set():
                out = _stream_once(client, self.url, self.key, self.models[n % len(self.models)])
                n += 1
                with self._lock:
                    self.outcomes.append(out)
                if not out.ok:
                    time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_DEADLINE_S + 15)
        assert not any(t.is_alive() for t in self._threads), "a client thread hung"


def _served(client: httpx.Client, url: str, key: str, model: str) -> bool:
    try:
        return _stream_once(client, url, key, model).ok
    except Exception:  # noqa: BLE001 - not yet
        return False


def _versions(client: httpx.Client, url: str, h: dict, names: list[str]) -> list[dict]:
    out = []
    for name in names:
        adapter = client.get(f"{url}/v1/adapters/{name}", headers=h).json()
        for n in range(1, adapter["version"] + 1):
            out.append(client.get(f"{url}/v1/adapters/{name}/versions/{n}", headers=h).json())
    return out


def test_killing_each_part_under_load(service_tmp_path: Path, tmp_path: Path) -> None:
    up = UpProcess(service_tmp_path / "data", 0)
    hf_config = json.loads((make_demo_model(tmp_path / "demo") / "config.json").read_text())
    url, admin = up.wait_started()
    data_dir = service_tmp_path / "data"
    rows = []
    try:
        with httpx.Client(timeout=30) as client:
            admin_h = {"Authorization": f"Bearer {admin}"}
            tenant = client.post(f"{url}/admin/v1/tenants", json={"name": "chaos"}, headers=admin_h)
            made = client.post(
                f"{url}/admin/v1/tenants/{tenant.json()['id']}/api-keys",
                json={"name": "load"},
                headers=admin_h,
            )
            key = made.json()["key"]
            tenant_h = {"Authorization": f"Bearer {key}"}
            names = [f"chaos-{i}" for i in range(ADAPTERS)]
            for i, name in enumerate(names):
                folder = write_random_adapter(
                    tmp_path / name, hf_config, 8, seed=i, targets=("q_proj", "v_proj")
                )
                upload_and_wait(url, key, "demo", name, folder)
            load = Load(url, key, names)
            try:
                time.sleep(5)  # steady state first
                for fault in FAULTS:
                    pid = supervised(data_dir)[fault]["pid"]
                    killed_at = time.monotonic()
                    os.kill(pid, signal.SIGKILL)
                    restarted(data_dir, fault, pid, timeout=RECOVERY_BOUND_S)
                    while not _served(client, url, key, names[0]):
                        assert time.monotonic() - killed_at < RECOVERY_BOUND_S, fault
                        time.sleep(0.5)
                    recovered = time.monotonic() - killed_at
                    if fault == "worker":  # a new version validates after the restart
                        upload_and_wait(url, key, "demo", names[1], tmp_path / names[1])
                    time.sleep(3)  # serving steadily again before the next fault
                    with load._lock:
                        hit = [o for o in load.outcomes if not o.ok and o.end >= killed_at]
                    rows.append((fault, len(hit), recovered))
            finally:
                load.stop()
            outcomes = list(load.outcomes)
            # Usage of the completed requests: every one counted once (a failed one may have
            # been metered for what it generated before it failed).
            time.sleep(3)  # the gateway flushes usage every second
            ok = [o for o in outcomes if o.ok]
            failed = [o for o in outcomes if not o.ok]
            usage = client.get(f"{url}/v1/usage", headers=tenant_h).json()["data"]
            metered = [r for r in usage if r["adapter"] in names]
            requests = sum(r["requests"] for r in metered)
            tokens = sum(r["completion_tokens"] for r in metered)
            versions = _versions(client, url, tenant_h, names)
    finally:
        code = up.interrupt()
    affected = {fault: (n, t) for fault, n, t in rows}
    print("\nfault              requests affected   time to recover (s)")
    for fault, (n, t) in affected.items():
        print(f"{fault:<18} {n:>17}   {t:>19.1f}")
    print(f"requests: {len(ok)} completed, {len(failed)} failed; usage rows: {requests}")
    assert code == 0
    assert len(rows) == len(FAULTS)
    assert all(t < RECOVERY_BOUND_S for _, t in affected.values())
    assert not [o for o in outcomes if o.end - o.start > REQUEST_DEADLINE_S + 5], "a client hung"
    assert not [o for o in failed if o.error.startswith("HUNG")], "a client hung"
    assert len(ok) >= 10, (len(ok), [o.error for o in failed][:10])
    assert len(ok) <= requests <= len(ok) + len(failed), (requests, len(ok), len(failed))
    ok_tokens = sum(o.tokens for o in ok)
    assert ok_tokens <= tokens <= ok_tokens + MAX_TOKENS * len(failed), (tokens, ok_tokens)
    assert not [v for v in versions if v["status"] == "validating"], versions
    assert [v["status"] for v in versions].count("ready") >= ADAPTERS + 1

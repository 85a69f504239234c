"""`loraplex up` follows its deployment's `replicas` (an admin's `PATCH
/admin/v1/deployments/{id}`: the reconcile loop starts and stops replica processes, each
supervised), and SIGTERM to `up` mid-stream stops its children in
order: the API finishes the stream while the replica still serves it, then everything exits
and `up` returns 0 with no process left behind."""

from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from support.opcli import OperatorShell
from support.up_process import UpProcess, alive

pytestmark = pytest.mark.timeout(600)


def _supervised(data_dir: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((data_dir / "logs" / "supervisor.json").read_text())
    return {}


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.3)


def _scale(url: str, admin: str, name: str, n: int) -> None:
    """What an operator does: PATCH the deployment's replica count."""
    h = {"Authorization": f"Bearer {admin}"}
    listing = httpx.get(f"{url}/admin/v1/deployments", headers=h, timeout=30).json()["data"]
    [dep] = [d for d in listing if d["name"] == name]
    resp = httpx.patch(f"{url}/admin/v1/deployments/{dep['id']}", json={"replicas": n},
                       headers=h, timeout=30)  # fmt: skip
    assert resp.status_code == 200 and resp.json()["replicas"] == n, resp.text


def test_up_scales_with_the_row_and_drains_on_sigterm(
    settings, pg_fresh_url: str, redis_url: str, service_tmp_path: Path
) -> None:
    name = f"demo-{uuid.uuid4().hex[:8]}"
    admin = "lpx-admin-scale-test-0123456789"
    env_extra = {
        "LORAPLEX_DATABASE_URL": pg_fresh_url,
        "LORAPLEX_S3_ENDPOINT_URL": settings.s3_endpoint_url,
        "LORAPLEX_S3_BUCKET": "loraplex-up-scale",
        "LORAPLEX_BROKER_URL": settings.broker_url,
        "LORAPLEX_ADMIN_KEY": admin,
    }
    data = service_tmp_path / "data"
    up = UpProcess(data, 0, env_extra, args=("--model-name", name))
    url, _ = up.wait_started()
    live = redis.Redis.from_url(redis_url)

    def registered() -> int:
        return live.zcount(f"loraplex:replicas:dep:{name}", int(time.time() * 1000), "+inf")

    try:
        _wait(lambda: registered() == 1, 60, "the first replica's registration")
        # Scale to 2: a second process starts.
        _scale(url, admin, name, 2)
        _wait(lambda: "engine replica 2" in _supervised(data), 60, "a second replica")
        second = _supervised(data)["engine replica 2"]["pid"]
        assert alive(second) and second != _supervised(data)["engine replica"]["pid"]
        _wait(lambda: registered() == 2, 240, "the second replica to be ready")
        # What the operator sees (`loraplex deployments status`, the admin API's view).
        shell = OperatorShell(url=url, admin_key=admin)
        status = shell.run("deployments", "status", name)
        assert status.returncode == 0, status.stderr
        assert status.stdout.strip() == f"{name}: 2 ready, 0 starting, 2 desired"
        # Back to 1: the newest drains and exits, the supervisor lets it go.
        _scale(url, admin, name, 1)
        _wait(lambda: not alive(second), 120, "the second replica to exit")
        assert "engine replica 2" not in _supervised(data)
        assert registered() == 1

        h = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(timeout=120) as client:
            tenant = client.post(f"{url}/admin/v1/tenants", json={"name": "acme"}, headers=h)
            assert tenant.status_code == 201, tenant.text
            key = client.post(f"{url}/admin/v1/tenants/{tenant.json()['id']}/api-keys",
                              json={"name": "k"}, headers=h).json()["key"]  # fmt: skip
            children = up.descendants()
            body = {"model": name, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 64, "temperature": 0, "stream": True}  # fmt: skip
            done, after = False, 0
            with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {key}"}) as resp:  # fmt: skip
                assert resp.status_code == 200, resp.read()
                signalled = False
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if not signalled:
                        up.proc.send_signal(signal.SIGTERM)  # mid-stream
                        signalled = True
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    chunk = json.loads(line[len("data: ") :])
                    assert "error" not in chunk, chunk
                    after += 1
        assert done and after >= 1  # the stream finished: the replica outlived the API's drain
        assert up.proc.wait(timeout=180) == 0, "\n".join(up.lines)
        assert not [p for p in children if alive(p)]
    finally:
        live.close()
        if up.proc.poll() is None:
            up.interrupt()

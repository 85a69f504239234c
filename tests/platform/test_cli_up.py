"""`loraplex up` as a user runs it: a subprocess on a fresh data dir; the API answers, an
adapter made with PEFT for the demo model reaches `ready` and changes the model's answer, a
replica or worker killed -9 is restarted by the supervisor while the API stays up (503 with
Retry-After meanwhile), secrets are 0600 and reach only the children that need them, Ctrl-C
leaves no process behind, and a second `up` on the same data dir finds the data again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.up_process import UpProcess, alive, restarted, supervised

from loraplex.platform.demo_model import make_demo_model


def _make_peft_adapter(model_dir: Path, out: Path) -> None:
    """A PEFT adapter with nonzero A and B (PEFT starts B at 0: such an adapter changes
    nothing, and a call could not show it was applied)."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"])
    lora = peft.get_peft_model(model, config)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    lora.save_pretrained(out)


def _upload_ready(
    client: httpx.Client, url: str, admin: str, adapter: Path
) -> tuple[str, dict[str, str]]:
    admin_h = {"Authorization": f"Bearer {admin}"}
    tenant = client.post(f"{url}/admin/v1/tenants", json={"name": "acme"}, headers=admin_h)
    assert tenant.status_code == 201, tenant.text
    key = client.post(
        f"{url}/admin/v1/tenants/{tenant.json()['id']}/api-keys",
        json={"name": "ci"},
        headers=admin_h,
    )
    assert key.status_code == 201, key.text
    tenant_h = {"Authorization": f"Bearer {key.json()['key']}"}
    assert _wait_ready(client, url, tenant_h, adapter, version=1)
    return tenant.json()["id"], tenant_h


def _wait_ready(
    client: httpx.Client, url: str, tenant_h: dict, adapter: Path, version: int
) -> bool:
    """Upload `adapter` as support-bot and wait for that version to be ready."""
    with (
        open(adapter / "adapter_config.json", "rb") as cfg,
        open(adapter / "adapter_model.safetensors", "rb") as weights,
    ):
        resp = client.post(
            f"{url}/v1/adapters",
            data={"name": "support-bot", "base_model": "demo"},
            files={"adapter_config": cfg, "adapter_model": weights},
            headers=tenant_h,
        )
    assert resp.status_code == 202 and resp.json()["version"] == version, resp.text
    deadline = time.monotonic() + 60
    body: dict = {}
    while time.monotonic() < deadline:
        got = client.get(f"{url}/v1/adapters/support-bot/versions/{version}", headers=tenant_h)
        assert got.status_code == 200, got.text
        body = got.json()
        status = body.get("status")
        if status in ("ready", "failed"):
            assert status == "ready", body
            return True
        time.sleep(0.5)
    pytest.fail(f"adapter never left validation: {body}")


def _chat(client: httpx.Client, url: str, headers: dict, model: str) -> httpx.Response:
    return client.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}],
              "max_tokens": 8, "temperature": 0},
        headers=headers,
    )  # fmt: skip


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def _check_secrets(data_dir: Path) -> None:
    for secret in ("admin_key", "postgres/password", "redis/password", "redis/redis.conf",
                   "seaweedfs/s3-secret-key", "seaweedfs/s3-identities.json"):  # fmt: skip
        assert (data_dir / secret).stat().st_mode & 0o777 == 0o600, secret
    pids = {name: c["pid"] for name, c in supervised(data_dir).items()}
    engine, worker, api = (_environ(pids[n]) for n in ("engine replica", "worker", "API"))
    assert "LORAPLEX_ADMIN_KEY" in api and "LORAPLEX_DATABASE_URL" in api
    assert "LORAPLEX_ADMIN_KEY" not in worker and "LORAPLEX_DATABASE_URL" in worker
    for secret in ("LORAPLEX_ADMIN_KEY", "LORAPLEX_DATABASE_URL", "LORAPLEX_BROKER_URL"):
        assert secret not in engine, secret
    assert engine["LORAPLEX_S3_SECRET_KEY"] == api["LORAPLEX_S3_SECRET_KEY"] != "loraplex-secret"
    # The embedded S3 refuses the well-known default credentials; Redis wants its password.
    import boto3
    import botocore.exceptions
    import redis

    s3 = boto3.client("s3", endpoint_url=api["LORAPLEX_S3_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="loraplex", aws_secret_access_key="loraplex-secret")  # fmt: skip
    with pytest.raises(botocore.exceptions.ClientError):
        s3.list_buckets()
    broker = redis.Redis.from_url(api["LORAPLEX_BROKER_URL"])
    assert broker.ping()
    anonymous = redis.Redis(host="127.0.0.1", port=broker.connection_pool.connection_kwargs["port"])
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    broker.close()
    anonymous.close()


@pytest.mark.slow
def test_up_serves_supervises_stops_and_restarts(service_tmp_path: Path, tmp_path: Path) -> None:
    up_dir = service_tmp_path / "data"
    first = UpProcess(up_dir, 0)  # port 0: the OS picks it, `up` binds it and prints it
    # While `up` boots: a PEFT adapter for the demo model (same seed, same shapes).
    adapter = tmp_path / "adapter"
    _make_peft_adapter(make_demo_model(tmp_path / "demo"), adapter)
    url, admin = first.wait_started()
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
    try:
        with httpx.Client(timeout=30) as client:
            assert client.get(f"{url}/healthz").json() == {"status": "ok"}
            no_auth = client.get(f"{url}/admin/v1/tenants")
            assert no_auth.status_code == 401
            console = first.value("Console")
            assert console is not None and console.startswith(f"{url}/console/")
            sign_in = client.get(console.split()[0] + "sign-in")
            assert sign_in.status_code == 200 and "admin key" in sign_in.text
            tenant_id, tenant_h = _upload_ready(client, url, admin, adapter)
            answers = {}
            for model in ("demo", "support-bot"):
                chat = _chat(client, url, tenant_h, model)
                assert chat.status_code == 200, (model, chat.text)
                assert chat.json()["usage"]["completion_tokens"] >= 1
                answers[model] = chat.json()["choices"][0]["message"]["content"]
            assert answers["support-bot"] != answers["demo"]  # the adapter was applied
            _check_secrets(up_dir)

            # kill -9 the replica: the API stays up, inference answers 503 + Retry-After
            # until the supervisor has it back, then the same answer again.
            engine_pid = supervised(up_dir)["engine replica"]["pid"]
            os.kill(engine_pid, signal.SIGKILL)
            # Until the new replica is ready a call either waits for it (it is starting:
            # the deployment's cold-start wait) or gets a 503 with Retry-After; never a 500.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                got = _chat(client, url, tenant_h, "support-bot")
                if got.status_code == 503:
                    assert int(got.headers["retry-after"]) >= 1, got.headers
                    code = got.json()["error"]["code"]
                    assert code in ("no_replica_available", "replicas_starting"), got.text
                    assert client.get(f"{url}/v1/adapters", headers=tenant_h).status_code == 200
                else:
                    assert got.status_code == 200, got.text
                    if supervised(up_dir)["engine replica"]["pid"] != engine_pid:
                        break  # served by the restarted replica
                time.sleep(0.2)
            assert got.status_code == 200, got.text
            assert got.json()["choices"][0]["message"]["content"] == answers["support-bot"]
            assert restarted(up_dir, "engine replica", engine_pid) != engine_pid

            # kill -9 the worker: it comes back and validates a new version.
            worker_pid = supervised(up_dir)["worker"]["pid"]
            os.kill(worker_pid, signal.SIGKILL)
            restarted(up_dir, "worker", worker_pid)
            assert _wait_ready(client, url, tenant_h, adapter, version=2)
        children = first.descendants()
        assert len(children) >= 5  # postgres, weed, redis, worker, API (+ postgres helpers)
    finally:
        code = first.interrupt()
    assert code == 0, "\n".join(first.lines)
    deadline = time.monotonic() + 10
    while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)], "children outlived `up`"
    assert any(line.startswith("stopped PostgreSQL") for line in first.lines)

    second = UpProcess(up_dir, 0)
    url2, admin2 = second.wait_started()
    try:
        assert admin2 == admin  # the key kept in the data dir
        with httpx.Client(timeout=30) as client:
            tenants = client.get(
                f"{url2}/admin/v1/tenants", headers={"Authorization": f"Bearer {admin2}"}
            )
            assert tenant_id in {t["id"] for t in tenants.json()["data"]}
    finally:
        assert second.interrupt() == 0, "\n".join(second.lines)


def test_up_refuses_a_busy_port(service_tmp_path: Path) -> None:
    tmp_path = service_tmp_path
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = UpProcess(tmp_path / "data", port)
        assert up.proc.wait(timeout=60) == 1
    up._reader.join(timeout=5)
    assert any("in use" in line for line in up.lines), up.lines


def test_cli_help_and_bench_listing() -> None:
    cli = [sys.executable, "-m", "loraplex.platform.cli"]
    out = subprocess.run([*cli, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "up" in out.stdout and "bench" in out.stdout
    bad = subprocess.run([*cli, "bench", "no-such"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "available:" in bad.stderr
    # Arguments after `engine` / `bench NAME` go to that command's own parser untouched.
    eng = subprocess.run([*cli, "engine", "--help"], capture_output=True, text=True, timeout=120)
    assert eng.returncode == 0 and "--model" in eng.stdout


def test_up_uses_services_given_by_url(settings, pg_fresh_url: str, service_tmp_path: Path) -> None:
    env_extra = {
        "LORAPLEX_DATABASE_URL": pg_fresh_url,
        "LORAPLEX_S3_ENDPOINT_URL": settings.s3_endpoint_url,
        "LORAPLEX_S3_BUCKET": "loraplex-up-external",
        "LORAPLEX_BROKER_URL": settings.broker_url,
        "LORAPLEX_ADMIN_KEY": "lpx-admin-from-env",
    }
    up = UpProcess(service_tmp_path / "data", 0, env_extra, args=("--no-engine",))
    url, admin = up.wait_started()
    try:
        assert admin == "lpx-admin-from-env"
        started = "\n".join(up.lines)
        for name in ("PostgreSQL", "SeaweedFS", "Redis", "Engine replica"):
            assert f"✓ {name}" not in started
        assert not (service_tmp_path / "data" / "postgres").exists()
        with httpx.Client(timeout=30) as client:
            tenants = client.get(
                f"{url}/admin/v1/tenants", headers={"Authorization": f"Bearer {admin}"}
            )
            assert tenants.status_code == 200, tenants.text
    finally:
        assert up.interrupt() == 0, "\n".join(up.lines)

"""An in-process serving stack for `loraplex bench serve` when no `--url` is given.

Embedded PostgreSQL, SeaweedFS and Redis under a temp dir; the demo model registered with a
deployment; a tenant and key; a Celery worker, the API (uvicorn) and one engine replica as
child processes (the replica kept registered by a health-gated heartbeat); K random LoRA
adapters in PEFT format uploaded through the tenant API and validated. Everything stops on
exit.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import torch
from rich.console import Console
from safetensors.torch import save

from loraplex.platform.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedSeaweedFS
from loraplex.platform.embedded.process import ServiceProcess
from loraplex.platform.gateway.replica_agent import register_replica
from loraplex.platform.settings import Settings

console = Console(stderr=True)
TARGETS = ("q_proj", "v_proj")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback only
        return resp.status == 200


def child_env(settings: Settings) -> dict[str, str]:
    """This process's environment plus every setting as a `LORAPLEX_*` variable."""
    import os

    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"LORAPLEX_{name.upper()}"] = str(value)
    return env


def random_peft_adapter(model_dir: Path, out: Path, seed: int, rank: int = 8) -> Path:
    """A random LoRA adapter for the Llama-style model in `model_dir`, in PEFT's layout."""
    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    outs = {"q_proj": heads * head_dim, "v_proj": cfg.get("num_key_value_heads", heads) * head_dim}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for target in TARGETS:
            stem = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.05
            tensors[f"{stem}.lora_B.weight"] = torch.randn(outs[target], rank, generator=gen) * 0.05
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_model.safetensors").write_bytes(save(tensors))
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "target_modules": list(TARGETS),
                "lora_dropout": 0.0,
                "bias": "none",
                "task_type": "CAUSAL_LM",
            }
        )
    )
    return out


def _upload(url: str, key: str, base: str, name: str, folder: Path) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    files = {
        "adapter_config": ("adapter_config.json", (folder / "adapter_config.json").read_bytes()),
        "adapter_model": (
            "adapter_model.safetensors",
            (folder / "adapter_model.safetensors").read_bytes(),
        ),
    }
    r = httpx.post(
        f"{url}/v1/adapters",
        headers=headers,
        files=files,
        data={"name": name, "base_model": base},
        timeout=120,
    )
    r.raise_for_status()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        doc = httpx.get(f"{url}/v1/adapters/{name}", headers=headers, timeout=30).json()
        if doc.get("status") == "ready":
            return
        if doc.get("status") == "failed":
            raise RuntimeError(f"adapter {name} failed validation: {doc.get('error')}")
        time.sleep(0.3)
    raise RuntimeError(f"adapter {name} was not validated in time")


@contextlib.contextmanager
def local_stack(num_adapters: int) -> Iterator[tuple[str, str, str, str]]:
    """Start everything; yields (API URL, tenant API key, replica URL, replica secret)."""
    from loraplex.platform.db.migrate import upgrade
    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.demo_model import make_demo_model
    from loraplex.platform.services.api_keys import create_api_key
    from loraplex.platform.services.base_models import register_base_model
    from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
    from loraplex.platform.services.objects import s3_client
    from loraplex.platform.services.tenants import create_tenant

    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lpx-bench-")))
        base = Settings()
        with console.status("starting PostgreSQL, SeaweedFS and Redis…"):
            pg = EmbeddedPostgres(root / "pg", durable=False)
            db_url = pg.start()
            stack.callback(pg.stop)
            s3 = EmbeddedSeaweedFS(
                root / "s3",
                access_key=base.s3_access_key,
                secret_key=base.s3_secret_key,
                region=base.s3_region,
            )
            s3_url = s3.start()
            stack.callback(s3.stop)
            rd = EmbeddedRedis(root / "redis", durable=False)
            redis_url = rd.start()
            stack.callback(rd.stop)
        settings = base.model_copy(
            update={
                "data_dir": root / "data",
                "database_url": db_url,
                "s3_endpoint_url": s3_url,
                "s3_bucket": "loraplex-bench",
                "broker_url": redis_url,
                "admin_key": "lpx-admin-bench",
                "replica_secret": "lpx-replica-" + secrets.token_urlsafe(32),
                "rate_limit_rpm": 1_000_000,
                "rate_limit_tpm": 1_000_000_000,
            }
        )
        upgrade(db_url)
        s3_client(settings).create_bucket(Bucket=settings.s3_bucket)
        model_dir = make_demo_model(root / "demo")
        register_base_model(settings, "demo", model_dir)
        with session_scope(make_sessionmaker(db_url)) as session:
            create_deployment(
                session,
                settings,
                DeploymentSpec(
                    name="demo-dep",
                    base_model="demo",
                    weight_quantization="fp32",
                    max_loras=max(num_adapters, 1),
                    max_lora_rank=16,
                ),
            )
            tenant = create_tenant(session, "bench")
            _, key = create_api_key(session, tenant.id, "bench")
        env = child_env(settings)
        procs = []
        for name, argv, port_probe in (
            ("worker", [sys.executable, "-m", "loraplex.platform.jobs.worker"], None),
            (
                "replica",
                [
                    sys.executable,
                    "-m",
                    "loraplex.platform.engine.server",
                    "--model",
                    str(model_dir),
                    "--max-loras",
                    str(max(num_adapters, 1)),
                    "--max-lora-rank",
                    "16",
                    "--log-level",
                    "warning",
                ],
                "/health",
            ),
            (
                "api",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--factory",
                    "loraplex.api.app:create_app",
                    "--log-level",
                    "warning",
                ],
                "/healthz",
            ),
        ):
            proc = ServiceProcess(name, root / f"{name}.log")
            port = _free_port()
            args = list(argv)
            if name == "replica":
                args += ["--port", str(port)]
            elif name == "api":
                args += ["--host", "127.0.0.1", "--port", str(port)]
            proc.start(args, env=env)
            stack.callback(proc.stop)
            procs.append(proc)
            if port_probe:
                with console.status(f"starting {name}…"):
                    proc.wait_ready(
                        lambda p=port, q=port_probe: _http_ok(f"http://127.0.0.1:{p}{q}"),
                        timeout=120,
                    )
            if name == "replica":
                replica_url = f"http://127.0.0.1:{port}"
                hb = register_replica(redis_url, "demo-dep", replica_url)
                stack.callback(hb.stop)
            if name == "api":
                api_url = f"http://127.0.0.1:{port}"
        with console.status(f"uploading {num_adapters} adapters…"):
            for i in range(num_adapters):
                folder = random_peft_adapter(model_dir, root / f"adapter{i}", seed=i)
                _upload(api_url, key, "demo", f"bench-{i}", folder)
        yield api_url, key, replica_url, settings.replica_secret

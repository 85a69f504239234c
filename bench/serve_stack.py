"""An in-process serving stack for `loraplex bench serve` when no `--url` is given.

Embedded PostgreSQL, SeaweedFS and Redis under a temp dir; the demo model registered with a
deployment; a tenant and key; a Celery worker, the API (uvicorn) and one engine replica as
child processes (the replica kept registered by a health-gated heartbeat); K random LoRA
adapters in PEFT format uploaded through the tenant API and validated. Everything stops on
exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from loraplex.bench._synthetic.adapters import write_random_adapter
from loraplex.platform.child_env import child_env
from loraplex.platform.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedSeaweedFS
from loraplex.platform.engine_spec import engine_config_for_deployment, on_a_shared_machine
from loraplex.platform.gateway.replica_agent import register_replica
from loraplex.platform.local_processes import (
    start_api_process,
    start_engine_process,
    start_worker_process,
)
from loraplex.platform.settings import Settings

console = Console(stderr=True)
TARGETS = ("q_proj", "v_proj")


def upload_and_wait(
    api_url: str, key: str, base: str, name: str, folder: Path, timeout_s: float = 120
) -> None:
    """Upload the PEFT adapter in `folder` through the tenant API as `name` over `base`, then
    wait until its version is ready (RuntimeError if it fails validation or times out)."""
    headers = {"Authorization": f"Bearer {key}"}
    files = {
        "adapter_config": ("adapter_config.json", (folder / "adapter_config.json").read_bytes()),
        "adapter_model": (
            "adapter_model.safetensors",
            (folder / "adapter_model.safetensors").read_bytes(),
        ),
    }
    r = httpx.post(
        f"{api_url}/v1/adapters",
        headers=headers,
        files=files,
        data={"name": name, "base_model": base},
        timeout=120,
    )
    r.raise_for_status()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc = httpx.get(f"{api_url}/v1/adapters/{name}", headers=headers, timeout=30).json()
        if doc.get("status") == "ready":
            return
        if doc.get("status") == "failed":
            raise RuntimeError(f"adapter {name} failed validation: {doc.get('error')}")
        time.sleep(0.3)
    raise RuntimeError(f"adapter {name} was not validated in time")


def _copy_logs(root: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for log in root.glob("*.log"):
        shutil.copy2(log, dest / log.name)


class StackInfo(tuple):
    """(API URL, tenant API key, replica URL, replica secret), plus what a benchmark that
    watches the API needs: its process id and log, and the admin key."""

    api_pid: int | None
    api_log: Path
    admin_key: str
    model_dir: Path
    replica_pid: int | None
    engine_config: Any  # the replica's EngineConfig
    adapter_dirs: dict[str, Path]  # uploaded adapter name -> its PEFT folder


@contextlib.contextmanager
def local_stack(
    num_adapters: int,
    keep_logs: Path | None = None,
    overrides: dict[str, Any] | None = None,
    engine_overrides: dict[str, Any] | None = None,
    deterministic: bool = False,
    weights: str = "fp32",
    max_loras: int | None = None,
) -> Iterator[StackInfo]:
    """Start everything; yields (API URL, tenant API key, replica URL, replica secret) as a
    `StackInfo`. With `keep_logs`, the children's logs are copied there when the stack stops;
    `overrides` are Settings fields for every child (e.g. `loop_stall_log_ms`),
    `engine_overrides` EngineConfig fields of the replica (e.g. `cpu_threads`); `deterministic`,
    `weights` and `max_loras` the deployment's options (default: fp32, `num_adapters` slots)."""
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
        if keep_logs is not None:
            stack.callback(_copy_logs, root, keep_logs)
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
                **(overrides or {}),
            }
        )
        upgrade(db_url)
        s3_client(settings).create_bucket(Bucket=settings.s3_bucket)
        model_dir = make_demo_model(root / "demo")
        register_base_model(settings, "demo", model_dir)
        with session_scope(make_sessionmaker(db_url)) as session:
            deployment = create_deployment(
                session,
                settings,
                DeploymentSpec(
                    name="demo-dep",
                    base_model="demo",
                    weight_quantization=weights,
                    max_loras=max_loras or max(num_adapters, 1),
                    max_lora_rank=16,
                    deterministic=deterministic,
                ),
            )
            engine_config = dataclasses.replace(  # as `loraplex up` runs it, on this machine
                on_a_shared_machine(engine_config_for_deployment(deployment, model=str(model_dir))),
                **(engine_overrides or {}),
            )
            tenant = create_tenant(session, "bench")
            _, key = create_api_key(session, tenant.id, "bench")
        worker = start_worker_process(child_env(settings, "worker"), root / "worker.log")
        stack.callback(worker.stop)
        with console.status("starting replica…"):
            replica_url, replica = start_engine_process(
                engine_config,
                root / "replica.log",
                child_env(settings, "engine"),
                log_level="warning",
                timeout=120,
            )
        stack.callback(replica.stop)
        hb = register_replica(redis_url, "demo-dep", replica_url)
        stack.callback(hb.stop)
        with console.status("starting api…"):
            api_url, api = start_api_process(child_env(settings, "api"), root / "api.log")
        stack.callback(api.stop)
        hf_config = json.loads((model_dir / "config.json").read_text())
        adapter_dirs: dict[str, Path] = {}
        with console.status(f"uploading {num_adapters} adapters…"):
            for i in range(num_adapters):
                folder = write_random_adapter(
                    root / f"adapter{i}", hf_config, 8, seed=i, targets=TARGETS, std=0.05
                )
                upload_and_wait(api_url, key, "demo", f"bench-{i}", folder)
                adapter_dirs[f"bench-{i}"] = Path(folder)
        info = StackInfo((api_url, key, replica_url, settings.replica_secret))
        info.api_pid = api.pid
        info.api_log = root / "api.log"
        info.admin_key = settings.admin_key or ""
        info.model_dir = model_dir
        info.replica_pid = replica.pid
        info.engine_config = engine_config
        info.adapter_dirs = adapter_dirs
        yield info

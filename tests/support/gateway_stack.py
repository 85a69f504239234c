"""A running stack for the gateway end-to-end tests: the API app and engine replicas as real
subprocesses on free ports (started by `platform/local_processes.py`, as `loraplex up` and
the serve benchmark start theirs), each replica kept registered for its deployment by a
health-gated heartbeat."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from loraplex.platform.child_env import child_env
from loraplex.platform.engine_spec import parse_engine_args
from loraplex.platform.gateway.replica_agent import register_replica
from loraplex.platform.local_processes import start_api_process, start_engine_process
from loraplex.platform.wire import WIRE_VERSION, WIRE_VERSION_HEADER, ReplicaState
from loraplex.platform.wire.auth import bearer

WIRE_HEADERS = {
    WIRE_VERSION_HEADER: str(WIRE_VERSION),
    "authorization": bearer(os.environ["LORAPLEX_REPLICA_SECRET"]),  # tests/conftest.py
}


def settings_env(settings: Any, role: str = "api", **overrides: Any) -> dict[str, str]:
    """The process environment that rebuilds `settings` (LORAPLEX_* variables) for a child of
    `role` (api, worker or engine: each sees only its own secrets), offline."""
    return {**child_env(settings.model_copy(update=overrides), role), "HF_HUB_OFFLINE": "1"}


class Replica:
    """An engine replica subprocess (`--model model_dir` plus `extra_args`, parsed by the
    engine's own options) and its registration heartbeat."""

    def __init__(
        self,
        model_dir: Path,
        deployment: str,
        redis_url: str,
        workdir: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        config, _ = parse_engine_args(["--model", str(model_dir), *(extra_args or [])])
        log = workdir / f"replica-{os.urandom(4).hex()}.log"
        self.url, self.proc = start_engine_process(
            config, log, env or dict(os.environ), log_level="warning", timeout=90
        )
        # A loaded CI machine can starve the health-gated beat for seconds: a short TTL would
        # expire a live replica mid-test (a dead one is skipped by the router anyway).
        self.heartbeat = register_replica(redis_url, deployment, self.url, ttl_s=15.0)

    def state(self) -> dict[str, Any]:
        """The replica's /state (checked against the wire format)."""
        resp = httpx.get(f"{self.url}/state", headers=WIRE_HEADERS, timeout=5)
        return ReplicaState.model_validate_json(resp.content).model_dump()

    def stop(self) -> None:
        """Deregister and stop."""
        self.heartbeat.stop()
        self.proc.stop()


class Api:
    """The API app (`loraplex.api.app:create_app`) under uvicorn."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.log = workdir / f"api-{os.urandom(4).hex()}.log"
        self.url, self.proc = start_api_process(env, self.log)

    def stop(self) -> None:
        """Stop the server."""
        self.proc.stop()

"""The local launcher on the real stack: the reconcile loop reads the deployments' rows from
PostgreSQL and really starts and stops `loraplex engine` processes to match: scaling a row
up and down, editing its engine options (the replica is replaced), a deployment created (its
base model loaded from S3) and one deleted. Each new
replica shows as starting, then ready and registered for the gateway; scaled-away replicas
drain and exit 0 and leave the registry and the supervisor."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy import delete, update
from support.control_plane import fresh_database
from support.gateway_stack import settings_env

from loraplex.platform.db.migrate import upgrade
from loraplex.platform.db.models import Deployment
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.launcher import READY, STARTING
from loraplex.platform.launcher.local import LocalLauncher
from loraplex.platform.launcher.reconcile import Reconciler
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.supervisor import Supervisor

pytestmark = pytest.mark.timeout(400)


def _live(client: redis.Redis, deployment: str) -> int:
    return client.zcount(f"loraplex:replicas:dep:{deployment}", int(time.time() * 1000), "+inf")


def _wait(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def _set_replicas(factory, name: str, n: int) -> None:
    with session_scope(factory) as session:
        session.execute(update(Deployment).where(Deployment.name == name).values(replicas=n))


def test_scaling_the_row_starts_and_stops_replica_processes(
    pg_url: str, settings, redis_url: str, tmp_path: Path
) -> None:
    db_url = fresh_database(pg_url, "launcher")
    upgrade(db_url)
    s = settings.model_copy(update={"database_url": db_url, "drain_timeout_s": 10.0})
    folder = make_demo_model(tmp_path / "demo")
    tag = uuid.uuid4().hex[:8]
    base, dep = f"demo-{tag}", f"demo-dep-{tag}"
    register_base_model(s, base, folder)
    factory = make_sessionmaker(db_url)
    with session_scope(factory) as session:
        create_deployment(session, s, DeploymentSpec(name=dep, base_model=base,
                                                     weight_quantization="fp32", replicas=1))  # fmt: skip
    supervisor = Supervisor(lambda text: None)
    launcher = LocalLauncher(s, tmp_path, settings_env(s, "engine"), local_models={base: folder},
                             watch=supervisor.add, unwatch=supervisor.remove)  # fmt: skip
    reconciler = Reconciler(launcher, factory)  # every deployment
    client = redis.Redis.from_url(redis_url)
    try:
        reconciler.once()
        [old] = launcher.replicas(dep)
        launcher.wait_ready(dep, timeout=180)
        assert [r.state for r in launcher.status(dep).replicas] == [READY]
        _wait(lambda: _live(client, dep) == 1)
        # The engine runs the row's options, from the one mapping.
        argv = old.process._last_start[0]  # what was really started
        assert argv[argv.index("--quantization") + 1] == "fp32"
        assert argv[argv.index("--model") + 1] == str(folder)

        # An edited deployment (other engine options): its replica is drained and replaced.
        with session_scope(factory) as session:
            session.execute(update(Deployment).where(Deployment.name == dep).values(max_loras=3))
        reconciler.once()
        [first] = launcher.replicas(dep)
        assert old.process.proc.returncode == 0 and first.process.pid != old.process.pid
        argv = first.process._last_start[0]
        assert argv[argv.index("--max-loras") + 1] == "3"
        assert set(supervisor.children) == {"engine replica"}
        launcher.wait_ready(dep, timeout=180)

        _set_replicas(factory, dep, 2)  # what PATCH /admin/v1/deployments/{id} does
        reconciler.once()
        # The new replica is reported starting while it does not answer /health. A tiny engine
        # can be up before the next line runs, so it is held (SIGSTOP) while status is read.
        new_pid = launcher.replicas(dep)[1].process.pid
        os.kill(new_pid, signal.SIGSTOP)
        try:
            status = launcher.status(dep)
        finally:
            os.kill(new_pid, signal.SIGCONT)
        assert status.desired == 2 and len(status.replicas) == 2
        assert status.replicas[1].state == STARTING
        launcher.wait_ready(dep, timeout=180)
        reps = launcher.replicas(dep)
        assert reps[0] is first and reps[1].process.pid != first.process.pid
        assert all(r.process.running() for r in reps)
        assert set(supervisor.children) == {"engine replica", "engine replica 2"}
        _wait(lambda: _live(client, dep) == 2)

        # An operator creates a deployment: its replica starts, the model from the bucket.
        # (A base model with no local copy, registered as `loraplex models add` does.)
        base2, dep2 = f"{base}-b", f"{dep}-s3"
        register_base_model(s, base2, folder)
        with session_scope(factory) as session:
            create_deployment(session, s, DeploymentSpec(name=dep2, base_model=base2,
                                                         weight_quantization="fp32"))  # fmt: skip
        reconciler.once()
        [other] = launcher.replicas(dep2)
        model_arg = other.process._last_start[0].index("--model") + 1
        assert other.process._last_start[0][model_arg] == f"s3://{s.s3_bucket}/models/{base2}"
        launcher.wait_ready(dep2, timeout=180)
        _wait(lambda: _live(client, dep2) == 1)

        _set_replicas(factory, dep, 0)
        with session_scope(factory) as session:  # and deletes the other one
            session.execute(delete(Deployment).where(Deployment.name == dep2))
        reconciler.once()
        assert launcher.replicas(dep) == launcher.replicas(dep2) == [] and supervisor.children == {}
        for r in [*reps, other]:
            assert r.process.proc.returncode == 0, r.process.log_path.read_text()[-2000:]
        assert _live(client, dep) == _live(client, dep2) == 0
    finally:
        launcher.stop_all()
        client.close()

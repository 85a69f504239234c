"""`loraplex launcher` as an operator runs it: deployment rows in PostgreSQL become engine
resources applied to a cluster (through a kubeconfig, with the official client; the cluster
here is a recording stand-in for its API server), and a changed `replicas` row re-applies
the Deployment with the new count."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import update
from support.gateway_catalog import seed_catalog
from support.infra import EXAMPLE_OUTPUTS, rendered
from support.kube_api import KubeApi

from loraplex.platform.db.migrate import upgrade
from loraplex.platform.db.models import Deployment
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.launcher.k8s import APPLY

pytest.importorskip("kubernetes")


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: test-token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path


def _once(db_url: str, kubeconfig: Path, args: list[str] | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    env["LORAPLEX_DATABASE_URL"] = db_url
    args = args or ["--env", "dev", "--outputs", str(EXAMPLE_OUTPUTS), "--tag", "v1.2.0"]
    proc = subprocess.run(
        [sys.executable, "-m", "loraplex.platform.cli", "launcher", *args,
         "--kubeconfig", str(kubeconfig), "--once"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_launcher_applies_each_deployment_and_follows_its_replicas(
    pg_fresh_url: str, tmp_path: Path
) -> None:
    upgrade(pg_fresh_url)
    base_name = f"m{uuid.uuid4().hex[:8]}"
    factory = make_sessionmaker(pg_fresh_url)
    with session_scope(factory) as session:
        _, dep = seed_catalog(session, base_name)
        name = dep.name
    with KubeApi() as api:
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", api.url)
        _once(pg_fresh_url, kubeconfig)
        path = f"/apis/apps/v1/namespaces/loraplex/deployments/engine-{name}"
        # The first apply creates the Deployment at the row's count (KEDA owns it afterwards).
        applied = next(c for c in api.calls if c.method == "PATCH" and c.path == path)
        assert applied.content_type == APPLY
        body = applied.body
        assert body["spec"]["replicas"] == 1
        args = body["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--model") + 1] == f"s3://example-loraplex-dev/models/{base_name}"
        assert args[args.index("--quantization") + 1] == "fp32"

        with session_scope(factory) as session:  # an operator scales it
            session.execute(update(Deployment).where(Deployment.name == name).values(replicas=3))
        # This pass runs the in-cluster Deployment's own command line, its ConfigMap's files
        # where the pod mounts them (the token's place taken by the kubeconfig).
        heartbeat = tmp_path / "heartbeat"
        _once(pg_fresh_url, kubeconfig, _in_cluster_args(tmp_path, heartbeat))
        assert api.objects[path]["spec"]["replicas"] == 3
        scaled = api.objects[path.replace("apps/v1", "keda.sh/v1alpha1").replace(
            "deployments", "scaledobjects")]  # fmt: skip
        assert scaled["spec"]["minReplicaCount"] == 3
        assert heartbeat.is_file()


def _in_cluster_args(tmp_path: Path, heartbeat: Path) -> list[str]:
    """The rendered launcher Deployment's arguments, with its mounts under `tmp_path`."""
    docs = [d for d in rendered()["dev/platform.yaml"]
            if d["metadata"]["name"] == "loraplex-launcher"]  # fmt: skip
    [config] = [d for d in docs if d["kind"] == "ConfigMap"]
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    for key, text in config["data"].items():
        (tmp_path / key).write_text(text)
    command = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["loraplex", "launcher"]
    return [a.replace("/etc/loraplex", str(tmp_path)).replace("/tmp/heartbeat", str(heartbeat))
            for a in command[2:]]  # fmt: skip

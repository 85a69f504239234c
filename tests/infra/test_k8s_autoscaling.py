"""Autoscaling can fire: Prometheus scrapes each engine's /metrics with the replica secret the
engine checks (a real ReplicaGuard answers the scrape), the in-cluster launcher renders a
ScaledObject (it owns min and max), and KEDA owns the replica count between them: a later
launcher pass never resets `spec.replicas`.

No cluster is reachable here; the ownership of `spec.replicas` follows the documented
server-side apply semantics (https://kubernetes.io/docs/reference/using-api/server-side-apply/,
"Field management" and "Transferring ownership"), modelled by `support.kube_api.KubeApi`, and
KEDA writes the count through the Deployment's scale subresource as an HPA does
(https://keda.sh/docs/latest/concepts/scaling-deployments/: "KEDA ... feeds [metrics] to the
Horizontal Pod Autoscaler"; https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/
"Migrating Deployments and StatefulSets to horizontal autoscaling": remove spec.replicas from
the manifests once an HPA manages them, or every apply resets the count)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from support.infra import release, rendered, validate_resource
from support.kube_api import KubeApi

from loraplex.platform.launcher.k8s import FIELD_MANAGER, KubernetesLauncher
from loraplex.platform.launcher.reconcile import BaseModelSnapshot, DeploymentSnapshot

kubernetes = pytest.importorskip("kubernetes")
NS = "loraplex"
DEP = f"/apis/apps/v1/namespaces/{NS}/deployments/engine-llama-8b"


def _row(replicas: int = 2) -> DeploymentSnapshot:
    return DeploymentSnapshot(
        name="llama-8b", weight_quantization="bf16", kv_cache_dtype="auto", max_loras=4,
        max_lora_rank=16, expert_parallel_size=1, replicas=replicas,
        base_model=BaseModelSnapshot("llama-8b", "models/llama-8b/"),
    )  # fmt: skip


def _of(env: str, kind: str, name: str) -> dict:
    [doc] = [d for d in rendered()[f"{env}/platform.yaml"] if d["kind"] == kind
             and d["metadata"]["name"] == name]  # fmt: skip
    return doc


def test_prometheus_scrapes_the_engine_with_the_secret_it_checks() -> None:
    from loraplex.platform.engine.server import ReplicaGuard

    for env in ("dev", "prod"):
        monitor = _of(env, "PodMonitor", "loraplex-engine")
        validate_resource(monitor)
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        auth = endpoint["authorization"]
        assert auth["type"] == "Bearer"
        ref = auth["credentials"]
        # The same Secret and key the engine container reads its replica secret from.
        secret = _of(env, "ExternalSecret", ref["name"])
        assert ref["key"] == "LORAPLEX_REPLICA_SECRET"
        assert ref["key"] in secret["spec"]["target"]["template"]["data"]
        engine = rendered()[f"{env}/engine-llama-8b.yaml"][0]["spec"]["template"]["spec"]
        [container] = [c for c in engine["containers"] if c["name"] == "engine"]
        assert {"secretRef": {"name": ref["name"]}} in container["envFrom"]
    # What Prometheus then sends (Authorization: Bearer <secret>) passes the engine's guard;
    # a scrape without it is refused (today's monitor sent none).
    app = Starlette(routes=[Route("/metrics", lambda _r: PlainTextResponse("m 1\n"))])
    client = TestClient(ReplicaGuard(app, "s3cret"))
    assert client.get("/metrics", headers={"authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/metrics").status_code == 401


def test_the_launcher_renders_a_scaled_object_between_the_row_and_the_ceiling() -> None:
    for env in ("dev", "prod"):
        rel = release(env)
        ceiling = rel.values["engine"]["keda"]["max_replicas"]
        launcher = KubernetesLauncher(rel, kubernetes.client.ApiClient())
        docs = launcher.resources(_row(1), 1)
        [scaled] = [d for d in docs if d["kind"] == "ScaledObject"]
        validate_resource(scaled)
        assert scaled["spec"]["minReplicaCount"] == 1
        assert scaled["spec"]["maxReplicaCount"] == ceiling > 1
        # A row above the ceiling is its own floor: no autoscaling, no ScaledObject.
        big = launcher.resources(_row(ceiling), ceiling)
        assert not [d for d in big if d["kind"] == "ScaledObject"]


def test_keda_owns_the_count_between_min_and_max() -> None:
    with KubeApi() as api:
        launcher = KubernetesLauncher(release("dev"), api.api_client())
        launcher.scale(_row(2), 2)  # creates the Deployment at the floor
        assert api.objects[DEP]["spec"]["replicas"] == 2
        # A raised floor is applied at once (not left to the HPA's next sync); the count
        # stays KEDA's.
        api.scale_by_autoscaler(DEP, 1)
        launcher.scale(_row(2), 2)
        assert api.objects[DEP]["spec"]["replicas"] == 2
        assert FIELD_MANAGER not in api.replica_owners[DEP]
        launcher.scale(_row(2), 2)  # the next pass hands the count over
        api.scale_by_autoscaler(DEP, 3)  # queue depth: KEDA's HPA adds one
        for _ in range(3):
            launcher.scale(_row(2), 2)
            assert api.objects[DEP]["spec"]["replicas"] == 3, "a launcher pass reset the count"
        assert FIELD_MANAGER not in api.replica_owners[DEP]
        api.objects[f"/api/v1/namespaces/{NS}/pods"] = {
            "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}  # fmt: skip
        assert launcher.status("llama-8b").desired == 3


def test_a_fixed_deployment_that_becomes_autoscaled_keeps_its_replicas() -> None:
    """The documented hand-over: the count is never removed (which would default it to 1)."""
    with KubeApi() as api:
        fixed = KubernetesLauncher(release("dev"), api.api_client(),
                                   max_replicas=lambda _row, n: n)  # fmt: skip
        fixed.scale(_row(3), 3)
        assert api.objects[DEP]["spec"]["replicas"] == 3
        auto = KubernetesLauncher(release("dev"), api.api_client())
        auto.scale(_row(3), 3)
        assert api.objects[DEP]["spec"]["replicas"] == 3
        assert FIELD_MANAGER not in api.replica_owners[DEP]
        api.scale_by_autoscaler(DEP, 4)
        auto.scale(_row(3), 3)
        assert api.objects[DEP]["spec"]["replicas"] == 4
        # Back to fixed: the launcher takes the count again and sets the row's.
        fixed.scale(_row(3), 3)
        assert api.objects[DEP]["spec"]["replicas"] == 3
        assert api.replica_owners[DEP] == {FIELD_MANAGER}


def test_a_drain_scale_down_survives_the_next_pass() -> None:
    """The README's drain runbook lowers the count by one (through the scale subresource, as
    `kubectl scale` does); under KEDA the launcher's next pass leaves it alone."""
    with KubeApi() as api:
        launcher = KubernetesLauncher(release("dev"), api.api_client())
        launcher.scale(_row(1), 1)
        api.scale_by_autoscaler(DEP, 3)
        launcher.scale(_row(1), 1)
        api.scale_by_autoscaler(DEP, 2)  # the operator's `kubectl scale --replicas=2`
        launcher.scale(_row(1), 1)
        assert api.objects[DEP]["spec"]["replicas"] == 2
        # A raised floor is applied at once (not left to the HPA's next sync); the count
        # stays KEDA's.
        api.scale_by_autoscaler(DEP, 1)
        launcher.scale(_row(2), 2)
        assert api.objects[DEP]["spec"]["replicas"] == 2
        assert FIELD_MANAGER not in api.replica_owners[DEP]

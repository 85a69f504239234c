"""The Kubernetes launcher: what it renders for a deployment row is valid for the cluster's
Kubernetes version and carries the row's choices (quantization, max_loras, N GPUs per pod for
expert-parallel size N); its command line is the local launcher's; scaling changes the replica
count; and its calls through the official client (server-side apply, deletes, reads) reach an
API server as Kubernetes expects them (a recording stand-in: no cluster is reachable here)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from support.infra import release, validate_resource
from support.kube_api import KubeApi

from loraplex.platform.engine_spec import (
    engine_config_for_deployment,
    on_a_shared_machine,
    parse_engine_args,
)
from loraplex.platform.launcher import READY, STARTING
from loraplex.platform.launcher.k8s import APPLY, FIELD_MANAGER, KubernetesLauncher
from loraplex.platform.launcher.local import LocalLauncher
from loraplex.platform.launcher.reconcile import BaseModelSnapshot, DeploymentSnapshot
from loraplex.platform.settings import Settings

kubernetes = pytest.importorskip("kubernetes")
NS = "loraplex"


def _row(**changes) -> DeploymentSnapshot:
    base = DeploymentSnapshot(
        name="qwen3-moe-fp8", weight_quantization="bf16", kv_cache_dtype="auto", max_loras=16,
        max_lora_rank=32, expert_parallel_size=8, replicas=2,
        base_model=BaseModelSnapshot("qwen3-moe", "models/qwen3-moe/"),
    )  # fmt: skip
    return DeploymentSnapshot(**{**base.__dict__, **changes})


def _launcher(api_client=None, **kw) -> KubernetesLauncher:
    """A launcher that keeps exactly the row's count unless `max_replicas` is given (the
    autoscaled default is tests/infra/test_k8s_autoscaling.py's)."""
    if api_client is None:
        api_client = kubernetes.client.ApiClient(kubernetes.client.Configuration())
    kw.setdefault("max_replicas", lambda _row, n: n)
    return KubernetesLauncher(release("dev"), api_client, **kw)


def _deployment(docs: list[dict]) -> dict:
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    return dep


def _engine_container(docs: list[dict]) -> dict:
    containers = _deployment(docs)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "engine")


def _option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_renders_valid_resources_with_the_rows_choices() -> None:
    row = _row()
    docs = _launcher().resources(row, row.replicas)
    assert {d["kind"] for d in docs} == {"Deployment", "PodDisruptionBudget"}
    for doc in docs:
        validate_resource(doc)  # kubernetes-validate, strict, the cluster's version
    engine = _engine_container(docs)
    args = engine["args"]
    assert _option(args, "--quantization") == "bf16"
    assert _option(args, "--max-loras") == "16" and _option(args, "--max-lora-rank") == "32"
    assert _option(args, "--ep-size") == "8"
    assert _option(args, "--model") == "s3://example-loraplex-dev/models/qwen3-moe"
    # N GPUs per pod for expert-parallel size N, on the pool whose nodes hold 8.
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    pod = _deployment(docs)["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["loraplex.dev/gpu-pool"] == "h100"
    # A one-GPU deployment lands on the one-GPU pool.
    small = _launcher().resources(_row(name="llama-8b", expert_parallel_size=1), 1)
    small_engine = _engine_container(small)
    assert small_engine["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert "--ep-size" not in small_engine["args"]
    assert _deployment(small)["spec"]["template"]["spec"]["nodeSelector"] == {
        "loraplex.dev/gpu-pool": "a10g"}  # fmt: skip
    # The client's own models read the rendered Deployment back field for field.
    as_model = kubernetes.client.V1Deployment.from_dict(_deployment(docs))
    assert as_model.spec.template.spec.containers[0].args == args
    assert as_model.spec.replicas == 2
    assert as_model.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"


def test_the_validator_refuses_a_broken_engine_resource() -> None:
    """Control: the check above can fail (a replica count that is not a number, a field the
    API does not have)."""
    docs = _launcher().resources(_row(), 1)
    for breakage in ("replicas", "field"):
        bad = copy.deepcopy(_deployment(docs))
        if breakage == "replicas":
            bad["spec"]["replicas"] = "two"
        else:
            bad["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
        with pytest.raises(Exception):  # noqa: B017 - kubernetes-validate's own error
            validate_resource(bad)


def test_local_and_kubernetes_launchers_run_the_same_command_line(tmp_path: Path) -> None:
    row = _row(weight_quantization="fp32", max_loras=5, expert_parallel_size=2)
    bucket = "example-loraplex-dev"
    local = LocalLauncher(Settings(s3_bucket=bucket, data_dir=tmp_path), tmp_path, {})
    k8s = _launcher()
    args = _engine_container(k8s.resources(row, 1))["args"]
    pod_args, bind = args[:-4], args[-4:]
    assert bind[0::2] == ["--host", "--port"]  # the template binds the pod IP, nothing else
    assert k8s.engine_args(row) == pod_args
    config, _ = parse_engine_args(pod_args)
    assert config == engine_config_for_deployment(row, bucket=bucket)
    assert (config.quantization, config.max_loras, config.ep_size) == ("fp32", 5, 2)
    # The same mapping; a local replica shares its machine with the API, so it leaves a core.
    local_config, _ = parse_engine_args(local.engine_args(row))
    assert local_config == on_a_shared_machine(config)
    assert config.cpu_threads is None and local_config.cpu_threads is not None


def test_scaling_changes_the_rendered_replica_count() -> None:
    row = _row()
    launcher = _launcher(max_replicas=lambda _row, n: n * 2)
    counts = {}
    for n in (1, 3):
        docs = launcher.resources(row, n)
        counts[n] = _deployment(docs)["spec"]["replicas"]
        [scaled] = [d for d in docs if d["kind"] == "ScaledObject"]
        validate_resource(scaled)
        assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (n, 2 * n)
    assert counts == {1: 1, 3: 3}


def test_scale_applies_server_side_and_status_reads_pods_back() -> None:
    row = _row(name="llama-8b", expert_parallel_size=1)
    with KubeApi() as api:
        launcher = _launcher(api.api_client())
        launcher.scale(row, 2)
        patches = [c for c in api.calls if c.method == "PATCH"]
        paths = [c.path for c in patches]
        assert paths == [f"/apis/apps/v1/namespaces/{NS}/deployments/engine-llama-8b",
                         f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/engine-llama-8b"]  # fmt: skip
        for call in patches:
            assert call.content_type == APPLY
            assert call.query == {"fieldManager": [FIELD_MANAGER], "force": ["true"]}
        assert patches[0].body == _deployment(launcher.resources(row, 2))
        assert patches[0].body["spec"]["replicas"] == 2
        # Not autoscaled: any earlier ScaledObject is deleted (404 when there is none is fine).
        assert any(c.method == "DELETE" and c.path.endswith("/scaledobjects/engine-llama-8b")
                   for c in api.calls)  # fmt: skip

        launcher.scale(row, 3)
        dep_path = paths[0]
        assert api.objects[dep_path]["spec"]["replicas"] == 3

        # The Deployment as the API server reports it, and its pods: one ready, one starting.
        api.objects[f"/api/v1/namespaces/{NS}/pods"] = {
            "kind": "PodList", "apiVersion": "v1", "metadata": {},
            "items": [_pod("engine-llama-8b-a", "10.0.0.5", ready=True),
                      _pod("engine-llama-8b-b", None, ready=False)],
        }  # fmt: skip
        status = launcher.status("llama-8b")
        assert status.desired == 3
        assert [(r.name, r.state, r.url) for r in status.replicas] == [
            ("engine-llama-8b-a", READY, "http://10.0.0.5:8100"),
            ("engine-llama-8b-b", STARTING, None),
        ]
        [pods_call] = [c for c in api.calls if c.path.endswith("/pods")]
        assert pods_call.query["labelSelector"] == [
            "app.kubernetes.io/name=loraplex-engine,loraplex.dev/deployment=llama-8b"]  # fmt: skip

        launcher.scale(row, 0)  # zero: the resources go
        assert dep_path not in api.objects
        assert launcher.status("llama-8b").desired == 0


def _pod(name: str, ip: str | None, *, ready: bool) -> dict:
    return {
        "kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": NS},
        "status": {"phase": "Running" if ready else "Pending", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip

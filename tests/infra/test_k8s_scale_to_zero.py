"""Scale to zero: a deployment whose row asks for 0 replicas keeps its engine Deployment at 0
under a KEDA ScaledObject with `minReplicaCount: 0`, woken by the gateway's count of requests
held for a replica (`loraplex:gateway_requests_waiting`), which Prometheus scrapes from the
API pods.

No cluster is reachable here; the tests follow KEDA's documented semantics
(https://keda.sh/docs/2.16/concepts/scaling-deployments/, "Activating and Scaling thresholds":
KEDA scales a target from 0 to 1 when a trigger's value is above its `activationThreshold`,
and back to 0 after `cooldownPeriod` once no trigger is active; between 1 and
`maxReplicaCount` the HPA scales on `threshold`), and server-side apply's ownership of
`spec.replicas` (https://kubernetes.io/docs/reference/using-api/server-side-apply/), modelled
by `support.kube_api.KubeApi`."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.infra import release, rendered, validate_resource
from support.kube_api import KubeApi

from loraplex.infra.k8s.render import EngineSpec, render_engine
from loraplex.platform.gateway.metrics import GatewayMetrics
from loraplex.platform.launcher.k8s import KubernetesLauncher
from loraplex.platform.launcher.reconcile import BaseModelSnapshot, DeploymentSnapshot

kubernetes = pytest.importorskip("kubernetes")
NS = "loraplex"
DEP = f"/apis/apps/v1/namespaces/{NS}/deployments/engine-llama-8b"
SO = f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/engine-llama-8b"
NAME = re.compile(r"\b(loraplex[:_][a-zA-Z0-9_:]+)")


def _row(replicas: int) -> DeploymentSnapshot:
    return DeploymentSnapshot(
        name="llama-8b", weight_quantization="bf16", kv_cache_dtype="auto", max_loras=4,
        max_lora_rank=16, expert_parallel_size=1, replicas=replicas,
        base_model=BaseModelSnapshot("llama-8b", "models/llama-8b/"),
    )  # fmt: skip


def _gateway_trigger(scaled: dict) -> dict:
    [trigger] = [t for t in scaled["spec"]["triggers"]
                 if "gateway_requests_waiting" in t["metadata"]["query"]]  # fmt: skip
    return trigger


def test_a_deployment_at_zero_is_woken_by_the_gateways_waiting_requests() -> None:
    rel = release("dev")
    assert rel.values["engine"]["keda"]["scale_to_zero"] is True
    docs = KubernetesLauncher(rel, kubernetes.client.ApiClient()).resources(_row(0), 0)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [scaled] = [d for d in docs if d["kind"] == "ScaledObject"]
    validate_resource(scaled)
    assert deployment["spec"]["replicas"] == 0
    spec = scaled["spec"]
    assert spec["minReplicaCount"] == 0
    assert spec["maxReplicaCount"] == rel.values["engine"]["keda"]["max_replicas"]
    trigger = _gateway_trigger(scaled)
    meta = trigger["metadata"]
    assert trigger["type"] == "prometheus"
    assert 'deployment="llama-8b"' in meta["query"] and f'namespace="{NS}"' in meta["query"]
    # One held request (value 1 > 0) activates 0 -> 1; KEDA reads the threshold as a string.
    assert float(meta["activationThreshold"]) == 0.0
    assert float(meta["threshold"]) >= 1
    # The engine's own queue still scales 1 -> N (and is the first trigger, as before).
    assert "loraplex:num_requests_waiting" in spec["triggers"][0]["metadata"]["query"]
    # Back to zero only after a cold start's worth of idleness.
    assert spec["cooldownPeriod"] >= 300


def test_the_trigger_reads_a_metric_the_gateway_exports_and_prometheus_scrapes() -> None:
    text = GatewayMetrics().render().decode()
    exported = {f.name for f in text_string_to_metric_families(text)}
    rel = release("dev")
    docs = KubernetesLauncher(rel, kubernetes.client.ApiClient()).resources(_row(0), 0)
    [scaled] = [d for d in docs if d["kind"] == "ScaledObject"]
    queried = set(NAME.findall(_gateway_trigger(scaled)["metadata"]["query"]))
    assert queried == {"loraplex:gateway_requests_waiting"}
    assert queried <= exported, sorted(queried - exported)
    # Prometheus scrapes the API pods' /metrics (where the gateway's registry is served).
    for env in ("dev", "prod"):
        [monitor] = [d for d in rendered()[f"{env}/platform.yaml"]
                     if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "loraplex-api"]  # fmt: skip
        validate_resource(monitor)
        assert monitor["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "loraplex-api"
        }
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")


def test_the_waiting_gauge_counts_requests_while_they_are_held() -> None:
    metrics = GatewayMetrics()

    def value() -> float:
        return metrics.requests_waiting.labels("llama-8b")._value.get()

    with metrics.waiting("llama-8b"):
        assert value() == 1
        with metrics.waiting("llama-8b"):
            assert value() == 2
    assert value() == 0
    with pytest.raises(RuntimeError), metrics.waiting("llama-8b"):
        raise RuntimeError
    assert value() == 0


def test_the_launcher_keeps_a_deployment_at_zero_and_leaves_the_count_to_keda() -> None:
    with KubeApi() as api:
        launcher = KubernetesLauncher(release("dev"), api.api_client())
        launcher.scale(_row(0), 0)
        assert api.objects[DEP]["spec"]["replicas"] == 0
        assert api.objects[SO]["spec"]["minReplicaCount"] == 0
        api.scale_by_autoscaler(DEP, 1)  # a request waits at the gateway: KEDA activates
        for _ in range(2):
            launcher.scale(_row(0), 0)
            assert api.objects[DEP]["spec"]["replicas"] == 1, "a launcher pass undid KEDA's 0->1"
        api.scale_by_autoscaler(DEP, 0)  # idle past cooldownPeriod
        launcher.scale(_row(0), 0)
        assert api.objects[DEP]["spec"]["replicas"] == 0
        assert SO in api.objects


def test_an_environment_without_scale_to_zero_refuses_a_zero_floor() -> None:
    rel = release("prod")
    assert rel.values["engine"]["keda"]["scale_to_zero"] is False
    spec = EngineSpec(deployment="llama-8b", argv=("--model", "x"), replicas=0, max_replicas=4,
                      gpu_pool=next(iter(rel.outputs["gpu_pools"])))  # fmt: skip
    with pytest.raises(ValueError, match="scale_to_zero"):
        render_engine(rel, spec)
    with KubeApi() as api:  # the launcher removes the engine resources instead
        launcher = KubernetesLauncher(rel, api.api_client())
        launcher.scale(_row(1), 1)
        assert DEP in api.objects
        launcher.scale(_row(0), 0)
        assert DEP not in api.objects


def test_the_load_balancer_does_not_serve_the_apis_metrics() -> None:
    """Prometheus reads /metrics from the pods; the internet-facing ALB answers it with a fixed
    404 (AWS Load Balancer Controller, "Ingress annotations", `actions.${action-name}` with a
    `fixed-response` action and a rule whose backend port is `use-annotation`)."""
    import json

    for env in ("dev", "prod"):
        [ingress] = [d for d in rendered()[f"{env}/platform.yaml"] if d["kind"] == "Ingress"]
        validate_resource(ingress)
        [rule] = ingress["spec"]["rules"]
        [path] = rule["http"]["paths"]
        assert (path["path"], path["pathType"]) == ("/metrics", "Prefix")
        backend = path["backend"]["service"]
        assert backend["port"] == {"name": "use-annotation"}
        action = json.loads(ingress["metadata"]["annotations"][
            f"alb.ingress.kubernetes.io/actions.{backend['name']}"])  # fmt: skip
        assert action["type"] == "fixed-response"
        assert action["fixedResponseConfig"]["statusCode"] == "404"
        # Everything else still reaches the API.
        assert ingress["spec"]["defaultBackend"]["service"]["name"] == "loraplex-api"


def test_the_gateway_holds_requests_at_zero_where_keda_wakes_them() -> None:
    """The API's settings turn the router's hold at zero on exactly where the environment
    scales to zero (tests/platform/gateway/test_gateway_hold_at_zero.py is the router's test)."""
    from loraplex.platform.settings import Settings

    for env in ("dev", "prod"):
        [config] = [d for d in rendered()[f"{env}/platform.yaml"]
                    if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "loraplex-platform"]  # fmt: skip
        raw = config["data"]["LORAPLEX_GATEWAY_HOLD_AT_ZERO"]
        held = Settings(gateway_hold_at_zero=raw).gateway_hold_at_zero
        assert held is release(env).values["engine"]["keda"]["scale_to_zero"], env

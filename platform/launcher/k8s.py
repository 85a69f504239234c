"""The Kubernetes launcher: a deployment's engine replicas as the resources
`infra/k8s/templates/engine.yaml.j2` renders (a Deployment with N GPUs per pod, its
PodDisruptionBudget, a KEDA ScaledObject when it may autoscale), applied with server-side
apply through the official `kubernetes` client, and read back from the Deployment and its pods.

The launcher owns a deployment's floor (the row's `replicas`) and ceiling (the environment's
`engine.keda.max_replicas`); KEDA owns the count between them. Once a ScaledObject manages a
Deployment, the launcher's apply leaves `spec.replicas` out, after handing the field to a
separate field manager at its live value (the documented transfer of ownership:
https://kubernetes.io/docs/reference/using-api/server-side-apply/#transferring-ownership), so
no pass resets what KEDA (or an operator's drain) set and the field is never removed.

The engine's options come from the row through `engine_spec.engine_args_for_deployment` (the
same mapping as the local launcher's); the template adds the pod's bind address.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loraplex.infra.k8s.render import EngineSpec, Release, render_engine
from loraplex.platform.engine_spec import engine_args_for_deployment
from loraplex.platform.engine_spec.deployment import DeploymentRow
from loraplex.platform.launcher.base import (
    READY,
    STARTING,
    STOPPED,
    DeploymentStatus,
    ReplicaStatus,
)

FIELD_MANAGER = "loraplex-control-plane"
# Holds a Deployment's `spec.replicas` while it passes from the launcher to KEDA's HPA.
HANDOVER_MANAGER = "loraplex-handover-to-keda"
APPLY = "application/apply-patch+yaml"
KEDA = ("keda.sh", "v1alpha1", "scaledobjects")


def first_fitting_pool(gpu_pools: dict[str, Any]) -> Callable[[DeploymentRow], str]:
    """A pool chooser: the pool with the fewest GPUs per node that still holds the
    deployment's expert-parallel group on one node (ties by name)."""

    def choose(deployment: DeploymentRow) -> str:
        fits = sorted(
            (int(p["gpus_per_node"]), name)
            for name, p in gpu_pools.items()
            if int(p["gpus_per_node"]) >= deployment.expert_parallel_size
        )
        if not fits:
            raise ValueError(
                f"deployment {deployment.name!r}: no GPU pool has "
                f"{deployment.expert_parallel_size} GPUs per node"
            )
        return fits[0][1]

    return choose


def resource_name(deployment: str) -> str:
    """The Kubernetes name of a deployment's engine resources."""
    return f"engine-{deployment}"


class KubernetesLauncher:
    """Engine replicas on a Kubernetes cluster (see the module docstring).

    `api_client` is a `kubernetes.client.ApiClient` (from a kubeconfig or the in-cluster
    config); `gpu_pool` picks the node pool of a deployment; `max_replicas` the ceiling KEDA
    may scale a deployment to (default: the environment's `engine.keda.max_replicas`)."""

    def __init__(
        self,
        release: Release,
        api_client: Any,
        *,
        bucket: str | None = None,
        gpu_pool: Callable[[DeploymentRow], str] | None = None,
        max_replicas: Callable[[DeploymentRow, int], int] | None = None,
    ) -> None:
        from kubernetes import client

        self.release = release
        self.namespace: str = release.outputs["namespace"]
        self.bucket = bucket or release.outputs["bucket_name"]
        self._pool = gpu_pool or first_fitting_pool(release.outputs["gpu_pools"])
        ceiling = int(release.values["engine"]["keda"]["max_replicas"])
        self._max = max_replicas or (lambda _row, n: max(n, ceiling))
        self.apps = client.AppsV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def engine_args(self, deployment: DeploymentRow) -> list[str]:
        """The engine options of every replica of `deployment` (the pod adds --host/--port)."""
        return engine_args_for_deployment(deployment, bucket=self.bucket)

    def spec(self, deployment: DeploymentRow, replicas: int) -> EngineSpec:
        """What the engine template is rendered with: one pod holds the whole expert-parallel
        group (`expert_parallel_size` GPUs)."""
        return EngineSpec(
            deployment=deployment.name,
            argv=tuple(self.engine_args(deployment)),
            gpus=deployment.expert_parallel_size,
            replicas=replicas,
            max_replicas=max(replicas, self._max(deployment, replicas)),
            gpu_pool=self._pool(deployment),
        )

    def resources(self, deployment: DeploymentRow, replicas: int) -> list[dict[str, Any]]:
        """The engine resources for `replicas` replicas of `deployment`, as objects."""
        return render_engine(self.release, self.spec(deployment, replicas))

    def scale(self, deployment: DeploymentRow, replicas: int) -> None:
        """Apply the resources for `replicas` replicas (server-side apply, this controller as
        the field manager). Zero keeps them at 0 under KEDA where the environment scales to
        zero (the gateway's held requests wake it), and deletes them elsewhere."""
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        asleep = self.release.scales_to_zero() and self.spec(deployment, 0).max_replicas >= 1
        if replicas == 0 and not asleep:
            self.stop(deployment.name)
            return
        docs = self.resources(deployment, replicas)
        scaled = [d["spec"] for d in docs if d["kind"] == "ScaledObject"]
        autoscaled = bool(scaled)
        for doc in docs:
            if doc["kind"] == "Deployment" and autoscaled:
                bounds = (scaled[0]["minReplicaCount"], scaled[0]["maxReplicaCount"])
                self._apply_autoscaled(doc, *bounds)
            else:
                self._apply(doc)
        if not autoscaled:
            self._delete_scaled_object(resource_name(deployment.name))

    def _apply_autoscaled(self, doc: dict[str, Any], floor: int, ceiling: int) -> None:
        """Apply a Deployment whose count KEDA owns: created at the floor, then (while this
        controller still owns `spec.replicas`, or the live count is outside [floor, ceiling])
        the field handed to `HANDOVER_MANAGER` at the live count within the bounds, and the
        Deployment applied without it."""
        name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
        live = self._read_deployment(name)
        if live is None:
            self._apply(doc)
            live = self._read_deployment(name)
        count = int(live.spec.replicas or floor) if live is not None else floor
        target = min(max(count, floor), ceiling)
        if live is not None and (_owns_replicas(live, FIELD_MANAGER) or target != count):
            handover = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": target},
            }
            self.apps.patch_namespaced_deployment(name, ns, handover, field_manager=HANDOVER_MANAGER,
                                                  force=True, _content_type=APPLY)  # fmt: skip
        spec = {k: v for k, v in doc["spec"].items() if k != "replicas"}
        self._apply({**doc, "spec": spec})

    def _read_deployment(self, name: str) -> Any:
        """The live Deployment `name`, or None."""
        from kubernetes.client.rest import ApiException

        try:
            return self.apps.read_namespaced_deployment(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _apply(self, doc: dict[str, Any]) -> None:
        name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
        common: dict[str, Any] = {
            "field_manager": FIELD_MANAGER,
            "force": True,
            "_content_type": APPLY,
        }
        kind = doc["kind"]
        if kind == "Deployment":
            self.apps.patch_namespaced_deployment(name, ns, doc, **common)
        elif kind == "PodDisruptionBudget":
            self.policy.patch_namespaced_pod_disruption_budget(name, ns, doc, **common)
        elif kind == "ScaledObject":
            group, version, plural = KEDA
            self.custom.patch_namespaced_custom_object(
                group, version, ns, plural, name, doc, **common
            )
        else:
            raise NotImplementedError(f"the launcher does not apply {kind} resources")

    def _delete_scaled_object(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        group, version, plural = KEDA
        try:
            self.custom.delete_namespaced_custom_object(
                group, version, self.namespace, plural, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def stop(self, deployment: str) -> None:
        """Delete the deployment's engine resources; Kubernetes sends each pod SIGTERM after
        its preStop wait, and the replica drains its requests before exiting."""
        from kubernetes.client.rest import ApiException

        name = resource_name(deployment)
        self._delete_scaled_object(name)
        for delete in (self.policy.delete_namespaced_pod_disruption_budget,
                       self.apps.delete_namespaced_deployment):  # fmt: skip
            try:
                delete(name, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def status(self, deployment: str) -> DeploymentStatus:
        """The Deployment's desired replica count and each of its pods: ready (its readiness
        condition holds), stopped (terminating) or starting."""
        from kubernetes.client.rest import ApiException

        try:
            dep = self.apps.read_namespaced_deployment(resource_name(deployment), self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return DeploymentStatus(deployment, 0, [])
            raise
        labels = dep.spec.selector.match_labels
        assert labels is not None  # the rendered Deployments select their pods by labels
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        # Any: the API server fills every listed pod's metadata.name and status (the client's
        # types leave each one optional).
        pods: list[Any] = self.core.list_namespaced_pod(
            self.namespace, label_selector=selector
        ).items
        port = self.release.values["engine"]["port"]
        out = []
        for pod in sorted(pods, key=lambda p: p.metadata.name):
            url = f"http://{pod.status.pod_ip}:{port}" if pod.status.pod_ip else None
            out.append(ReplicaStatus(pod.metadata.name, _pod_state(pod), url))
        return DeploymentStatus(deployment, int(dep.spec.replicas or 0), out)


def _owns_replicas(deployment: Any, manager: str) -> bool:
    """Whether `manager`'s applied configuration holds the Deployment's `spec.replicas`."""
    for entry in deployment.metadata.managed_fields or []:
        fields = (entry.fields_v1 or {}).get("f:spec", {})
        if entry.manager == manager and entry.operation == "Apply" and "f:replicas" in fields:
            return True
    return False


def _pod_state(pod: Any) -> str:
    if pod.metadata.deletion_timestamp is not None or pod.status.phase in ("Succeeded", "Failed"):
        return STOPPED
    for cond in pod.status.conditions or []:
        if cond.type == "Ready" and cond.status == "True":
            return READY
    return STARTING

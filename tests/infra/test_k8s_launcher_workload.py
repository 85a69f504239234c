"""The in-cluster launcher: its Role allows exactly the calls the Kubernetes launcher sends
(recorded from the launcher itself against the stand-in API server, not a copied list), its
pod gets the account's token only through a projected volume, its network policy reaches
PostgreSQL, the Kubernetes API and DNS only, and its ConfigMap holds the release it renders."""

from __future__ import annotations

import json

import pytest
from support.infra import all_docs, example_outputs, pod_spec, release, rendered
from support.kube_api import Call, KubeApi, rbac_permissions

from loraplex.platform.launcher.k8s import KubernetesLauncher
from loraplex.platform.launcher.reconcile import BaseModelSnapshot, DeploymentSnapshot

kubernetes = pytest.importorskip("kubernetes")
NS = "loraplex"


def _docs(kind: str, env: str = "dev") -> list[dict]:
    return [d for d in rendered()[f"{env}/platform.yaml"] if d["kind"] == kind
            and d["metadata"]["name"].endswith("launcher")]  # fmt: skip


def _row(name: str, ep: int) -> DeploymentSnapshot:
    return DeploymentSnapshot(
        name=name, weight_quantization="bf16", kv_cache_dtype="auto", max_loras=4,
        max_lora_rank=16, expert_parallel_size=ep, replicas=1,
        base_model=BaseModelSnapshot("base", "models/base/"),
    )  # fmt: skip


def _launcher_calls() -> set[tuple[str, str, str]]:
    """Every permission the launcher's code paths need: scale (autoscaled and not), status,
    scale to zero and stop."""
    with KubeApi() as api:
        client = kubernetes.client.Configuration()
        client.host = api.url
        auto = KubernetesLauncher(release("dev"), kubernetes.client.ApiClient(client),
                                  max_replicas=lambda _row, n: n * 2)  # fmt: skip
        fixed = KubernetesLauncher(release("dev"), kubernetes.client.ApiClient(client))
        a, b = _row("auto", 1), _row("fixed", 8)
        auto.scale(a, 2)
        fixed.scale(b, 2)
        api.objects[f"/api/v1/namespaces/{NS}/pods"] = {
            "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}  # fmt: skip
        assert auto.status("auto").desired == 2
        auto.scale(a, 0)
        fixed.stop("fixed")
        assert auto.status("missing").desired == 0
        assert all(f"/namespaces/{NS}/" in c.path for c in api.calls)
        return set().union(*(rbac_permissions(c) for c in api.calls))


def test_rbac_verbs_follow_the_api_servers_authorization_of_each_call() -> None:
    """The derivation itself (documents named in `rbac_permissions`): a server-side apply of a
    missing object is authorized as patch AND create, of an existing one as patch only."""
    dep = f"/apis/apps/v1/namespaces/{NS}/deployments/engine-x"
    apply = "application/apply-patch+yaml"
    assert rbac_permissions(Call("PATCH", dep, {}, apply, {}, existed=False)) == {
        ("apps", "deployments", "patch"), ("apps", "deployments", "create")}  # fmt: skip
    assert rbac_permissions(Call("PATCH", dep, {}, apply, {}, existed=True)) == {
        ("apps", "deployments", "patch")}  # fmt: skip
    merge = "application/merge-patch+json"
    assert rbac_permissions(Call("PATCH", dep, {}, merge, {}, existed=False)) == {
        ("apps", "deployments", "patch")}  # fmt: skip
    assert rbac_permissions(Call("GET", dep, {}, "", None)) == {("apps", "deployments", "get")}
    pods = f"/api/v1/namespaces/{NS}/pods"
    assert rbac_permissions(Call("GET", pods, {}, "", None)) == {("", "pods", "list")}
    assert rbac_permissions(Call("DELETE", dep, {}, "", None, True)) == {
        ("apps", "deployments", "delete")}  # fmt: skip


def test_the_role_allows_exactly_what_the_launcher_calls() -> None:
    needed = _launcher_calls()
    # The first apply of each engine resource creates it: the Role must grant create.
    assert {("apps", "deployments", "create"), ("policy", "poddisruptionbudgets", "create"),
            ("keda.sh", "scaledobjects", "create")} <= needed  # fmt: skip
    # The scenario reached each kind of call the launcher makes (a broken scenario would
    # make the comparison vacuous).
    assert {("keda.sh", "scaledobjects", "patch"), ("", "pods", "list"),
            ("apps", "deployments", "get")} <= needed  # fmt: skip
    for env in ("dev", "prod"):
        [role] = _docs("Role", env)
        granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                   for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
        assert granted == needed, (env, granted ^ needed)
        assert "resourceNames" not in str(role["rules"])
        [binding] = _docs("RoleBinding", env)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "loraplex-launcher", "namespace": NS}]  # fmt: skip
    # No ClusterRole: the launcher's rights end at the namespace.
    assert not [d for d in all_docs() if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_launcher_pod_runs_the_controller_with_a_projected_token() -> None:
    [dep] = _docs("Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    spec = pod_spec(dep)
    assert spec["serviceAccountName"] == "loraplex-launcher"
    assert spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    assert container["command"][:2] == ["loraplex", "launcher"]
    assert container["image"].endswith("/platform:v1.2.0")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "/tmp/heartbeat" in " ".join(container[probe]["exec"]["command"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["kube-api-access"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    [volume] = [v for v in spec["volumes"] if v["name"] == "kube-api-access"]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert sources[1]["configMap"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # Only the database URL, by reference to the External Secret's target.
    [db] = [e for e in container["env"] if e["name"] == "LORAPLEX_DATABASE_URL"]
    assert db["valueFrom"]["secretKeyRef"] == {"name": "loraplex-platform",
                                              "key": "LORAPLEX_DATABASE_URL"}  # fmt: skip
    assert "envFrom" not in container
    [account] = [d for d in rendered()["dev/platform.yaml"] if d["kind"] == "ServiceAccount"
                 and d["metadata"]["name"] == "loraplex-launcher"]  # fmt: skip
    assert "annotations" not in account["metadata"]  # no AWS role: it calls no AWS API


def test_the_launcher_configmap_is_this_release() -> None:
    for env in ("dev", "prod"):
        [cm] = _docs("ConfigMap", env)
        outputs = {k: v["value"] for k, v in json.loads(cm["data"]["outputs.json"]).items()}
        assert outputs == example_outputs()
        assert json.loads(cm["data"]["values.json"]) == release(env).values


def test_the_launcher_reaches_only_postgres_the_api_server_and_dns() -> None:
    [policy] = [d for d in rendered()["dev/platform.yaml"] if d["kind"] == "NetworkPolicy"
                and d["metadata"]["name"] == "launcher"]  # fmt: skip
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "loraplex-launcher"}}
    assert "ingress" not in spec and "Ingress" in spec["policyTypes"]
    outputs = example_outputs()
    rules = [([next(iter(t.values())) for t in r["to"]], r["ports"]) for r in spec["egress"]]
    dns, pg, kube = rules
    assert {p["port"] for p in dns[1]} == {53}
    assert [t["cidr"] for t in pg[0]] == outputs["database_subnet_cidrs"]
    assert pg[1] == [{"protocol": "TCP", "port": outputs["database_port"]}]
    assert kube == ([{"cidr": outputs["vpc_cidr"]}], [{"protocol": "TCP", "port": 443}])

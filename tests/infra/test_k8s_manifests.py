"""The Kubernetes resources: valid for the cluster's Kubernetes version, lint-clean, and
shaped as the platform needs (GPU engines, probes, drain, KEDA, network isolation)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from support.crd_schemas import SCHEMAS
from support.infra import (
    ENVS,
    INFRA,
    TERRAFORM,
    all_docs,
    blocks,
    documents,
    example_engines,
    pod_spec,
    release,
    rendered,
    rendered_texts,
    unq,
)

from loraplex.infra.k8s.render import EngineSpec, mem_times, render_engine


def _kubernetes_version() -> str:
    versions = {unq(next(iter(blocks(TERRAFORM / "envs" / e, "module").values()))["kubernetes_version"])
                for e in ENVS}  # fmt: skip
    [version] = versions
    return f"{version}.0"


def _validate(doc: dict) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in SCHEMAS:
        jsonschema.validate(doc, SCHEMAS[key])
    else:
        kubernetes_validate.validate(doc, _kubernetes_version(), strict=True)


def test_every_rendered_resource_is_valid_for_the_cluster_version() -> None:
    kinds = set()
    for name, docs in rendered().items():
        for doc in docs:
            try:
                _validate(doc)
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
                pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {exc}")
            kinds.add(doc["kind"])
    assert {"Deployment", "Job", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "NetworkPolicy", "ServiceAccount", "ScaledObject", "ExternalSecret", "Role",
            "RoleBinding", "ConfigMap"} <= kinds  # fmt: skip


def test_the_validators_refuse_a_broken_resource() -> None:
    """Control: a misspelled field fails both kinds of validation (the checks can fail)."""
    deployment = next(d for d in all_docs() if d["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(bad)
    scaled = copy.deepcopy(next(d for d in all_docs() if d["kind"] == "ScaledObject"))
    scaled["spec"]["minReplicas"] = 1
    with pytest.raises(jsonschema.ValidationError):
        _validate(scaled)


def test_yamllint_passes_the_yaml(tmp_path: Path) -> None:
    for name, text in rendered_texts().items():
        out = tmp_path / name.replace("/", "-")
        out.write_text(text)
    files = [str(p) for p in tmp_path.iterdir()]
    files += [str(p) for p in INFRA.rglob("*.yaml")] + [str(INFRA / ".yamllint.yaml")]
    proc = subprocess.run(
        [sys.executable, "-m", "yamllint", "-s", "-c", str(INFRA / ".yamllint.yaml"), *files],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _by(name_part: str, kind: str, env: str = "dev") -> list[dict]:
    return [d for n, docs in rendered().items() if n.startswith(env) and name_part in n
            for d in docs if d["kind"] == kind]  # fmt: skip


def test_every_pod_runs_hardened() -> None:
    pods = [(d, pod_spec(d)) for d in all_docs() if pod_spec(d) is not None]
    assert len(pods) >= 5
    for doc, spec in pods:
        where = f"{doc['kind']} {doc['metadata']['name']}"
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["automountServiceAccountToken"] is False, where
        assert spec["serviceAccountName"].startswith("loraplex-"), where
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert "limits" in c["resources"], where
            # Secrets only by reference, never a literal value in a manifest.
            for env in c.get("env", []):
                if any(w in env["name"] for w in ("KEY", "SECRET", "PASSWORD", "URL")):
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"], where


def test_api_has_an_hpa_a_pdb_and_a_migration_ahead() -> None:
    [api] = [d for d in _by("platform", "Deployment") if d["metadata"]["name"] == "loraplex-api"]
    [hpa] = _by("platform", "HorizontalPodAutoscaler")
    [pdb] = [d for d in _by("platform", "PodDisruptionBudget")]
    outputs = release("dev").outputs
    assert hpa["spec"]["scaleTargetRef"]["name"] == "loraplex-api"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        outputs["api_replicas"]["min"], outputs["api_replicas"]["max"])  # fmt: skip
    assert pdb["spec"]["selector"]["matchLabels"] == api["spec"]["selector"]["matchLabels"]
    [job] = _by("platform", "Job")
    assert job["metadata"]["name"] == "loraplex-migrate-v1-2-0"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["python", "-m", "loraplex.platform.db.migrate", "upgrade", "head"]
    from loraplex.infra.k8s.render import PRE_ROLLOUT, ROLLOUT

    assert PRE_ROLLOUT[-1] == "migrate" and "api" in ROLLOUT  # deploy.sh waits in between
    # A rollback across a migration: the same Job, going down to the older head.
    down = documents(
        release("prod").render("migrate", migration={"action": "downgrade", "revision": "0003"})
    )
    [down_job] = down
    assert down_job["metadata"]["name"] == "loraplex-downgrade-v1-2-0"
    assert down_job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == [
        "downgrade",
        "0003",
    ]
    _validate(down_job)


def _engine(deployment: str, env: str = "dev") -> dict[str, dict]:
    docs = rendered()[f"{env}/engine-{deployment}.yaml"]
    return {d["kind"]: d for d in docs}


def test_engine_pods_ask_for_their_gpus_and_wait_for_a_cold_start() -> None:
    values = release("dev").values["engine"]
    for spec in example_engines():
        res = _engine(spec.deployment)
        pod = res["Deployment"]["spec"]["template"]["spec"]
        engine = pod["containers"][0]
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == str(spec.gpus)
        assert engine["resources"]["requests"]["memory"] == mem_times(
            values["memory_per_gpu"], spec.gpus
        )
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        assert pod["nodeSelector"] == {"loraplex.dev/gpu-pool": spec.gpu_pool}
        assert engine["args"][: len(spec.argv)] == list(spec.argv)
        assert engine["args"][len(spec.argv) :] == [
            "--host",
            "$(POD_IP)",
            "--port",
            str(values["port"]),
        ]
        startup = engine["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= values["startup_timeout_s"]
        assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
        assert engine["lifecycle"]["preStop"]["exec"]["command"] == [
            "sleep",
            str(values["deregister_wait_s"]),
        ]
        assert (
            pod["terminationGracePeriodSeconds"]
            == values["deregister_wait_s"] + values["drain_timeout_s"]
        )
        agent = pod["containers"][1]
        assert agent["args"] == ["--replica-url", f"http://$(POD_IP):{values['port']}",
                                 "--deployment", spec.deployment]  # fmt: skip


def test_keda_scales_on_queue_depth_with_a_scale_down_delay() -> None:
    values = release("dev").values["engine"]["keda"]
    autoscaled, fixed = example_engines()
    scaled = _engine(autoscaled.deployment)["ScaledObject"]["spec"]
    assert scaled["minReplicaCount"] == autoscaled.replicas >= 1
    assert scaled["maxReplicaCount"] == autoscaled.max_replicas
    assert scaled["cooldownPeriod"] == values["scale_down_delay_s"]
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == values["scale_down_delay_s"]
    [trigger] = scaled["triggers"]
    assert "loraplex:num_requests_waiting" in trigger["metadata"]["query"]
    assert f'deployment="{autoscaled.deployment}"' in trigger["metadata"]["query"]
    assert "ScaledObject" not in _engine(fixed.deployment)  # replicas == max: no autoscaler


def test_scaling_a_deployment_changes_what_is_rendered() -> None:
    rel = release("prod")
    base = example_engines()[0]
    one = render_engine(rel, base)
    three = render_engine(rel, EngineSpec(**{**base.__dict__, "replicas": 3, "max_replicas": 6}))
    deployments = [next(d for d in docs if d["kind"] == "Deployment") for docs in (one, three)]
    assert [d["spec"]["replicas"] for d in deployments] == [1, 3]
    scaled = next(d for d in three if d["kind"] == "ScaledObject")
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (3, 6)


def test_engine_specs_that_cannot_run_are_refused() -> None:
    rel, base = release("dev"), example_engines()[0]
    with pytest.raises(ValueError, match="scale_to_zero"):  # prod keeps a warm floor
        release("prod").engine(EngineSpec(**{**base.__dict__, "replicas": 0}))
    with pytest.raises(ValueError, match="max_replicas >= 1"):  # nothing could wake it
        rel.engine(EngineSpec(**{**base.__dict__, "replicas": 0, "max_replicas": 0}))
    with pytest.raises(ValueError, match="cannot fit"):
        rel.engine(EngineSpec(**{**base.__dict__, "gpus": 2}))  # a10g nodes have one GPU
    with pytest.raises(ValueError, match="does not exist"):
        rel.engine(EngineSpec(**{**base.__dict__, "gpu_pool": "tpu"}))
    with pytest.raises(ValueError, match="--host"):
        rel.engine(EngineSpec(**{**base.__dict__, "argv": (*base.argv, "--host", "0.0.0.0")}))
    with pytest.raises(ValueError, match="DNS label"):
        rel.engine(EngineSpec(**{**base.__dict__, "deployment": "Llama_8B"}))


def _policies() -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"] for d in _by("platform", "NetworkPolicy")}


def _egress_ports(spec: dict) -> set[int]:
    return {p["port"] for rule in spec.get("egress", []) for p in rule.get("ports", [])}


def test_network_policies_isolate_replicas_and_data_stores() -> None:
    pol = _policies()
    assert pol["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    # Only the gateway (api pods) and Prometheus reach the replicas.
    [rule] = pol["engine"]["ingress"]
    sources = [(s.get("podSelector"), s.get("namespaceSelector")) for s in rule["from"]]
    assert sources[0] == ({"matchLabels": {"app.kubernetes.io/name": "loraplex-api"}}, None)
    assert sources[1][1] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert len(sources) == 2
    # PostgreSQL: api, worker, migration, the model admin, the launcher; Redis: api, worker,
    # replica agent.
    reach_db = {n for n, p in pol.items() if 5432 in _egress_ports(p)}
    reach_redis = {n for n, p in pol.items() if 6379 in _egress_ports(p)}
    assert reach_db == {"api", "worker", "migrate", "models-admin", "launcher"}
    assert reach_redis == {"api", "worker", "engine"}
    outputs = release("dev").outputs
    for name in reach_db:
        [db_rule] = [
            r for r in pol[name]["egress"] if r["ports"] == [{"protocol": "TCP", "port": 5432}]
        ]
        assert [t["ipBlock"]["cidr"] for t in db_rule["to"]] == outputs["database_subnet_cidrs"]


def test_no_secret_value_is_in_any_manifest() -> None:
    assert not [d for d in all_docs() if d["kind"] == "Secret"]
    externals = [d for d in all_docs() if d["kind"] == "ExternalSecret"]
    arns = {ref["remoteRef"]["key"] for d in externals for ref in d["spec"]["data"]}
    outputs = release("dev").outputs
    assert arns == {outputs["database_secret_arn"], outputs["redis_auth_secret_arn"],
                    outputs["admin_key_secret_arn"], outputs["replica_secret_arn"]}  # fmt: skip

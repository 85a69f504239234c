"""Karpenter as an option for the GPU nodes (`gpu_provisioner = "karpenter"`, dev's choice):
one NodePool per GPU pool (its label and taint, so the engine pods land there as they do on
the managed node groups), spot in dev, consolidation, a GPU limit per pool; the managed GPU
node groups are not made then. Checked against Karpenter's v1 API reference
(https://karpenter.sh/docs/concepts/nodepools/, https://karpenter.sh/docs/concepts/nodeclasses/,
https://karpenter.sh/docs/concepts/disruption/: `consolidationPolicy: WhenEmptyOrUnderutilized`
replaces a node whose pods fit elsewhere or on a cheaper one; `limits` caps what a pool may
launch) and the CRD schemas in support.crd_schemas."""

from __future__ import annotations

import re

from support.infra import (
    TERRAFORM,
    blocks,
    documents,
    example_engines,
    example_outputs,
    folder_text,
    pod_spec,
    unq,
    validate_resource,
)

from loraplex.infra.k8s.render import PRE_ROLLOUT, ROLLOUT, Release, load_values


def _release(provisioner: str) -> Release:
    outputs = example_outputs() | {"gpu_provisioner": provisioner,
                                   "karpenter_node_role_name": "loraplex-dev-karpenter-node"}  # fmt: skip
    return Release(outputs, load_values("dev"), "v1.2.0")


def _docs(rel: Release, kind: str) -> list[dict]:
    return [d for d in documents(rel.platform(PRE_ROLLOUT + ROLLOUT)) if d["kind"] == kind]


def test_a_nodepool_per_gpu_pool_where_the_engine_pods_land() -> None:
    rel = _release("karpenter")
    pools = example_outputs()["gpu_pools"]
    nodepools = {d["metadata"]["name"]: d for d in _docs(rel, "NodePool")}
    assert set(nodepools) == {f"gpu-{p}" for p in pools}
    [nodeclass] = _docs(rel, "EC2NodeClass")
    validate_resource(nodeclass)
    spec = nodeclass["spec"]
    assert spec["role"] == "loraplex-dev-karpenter-node"
    cluster = example_outputs()["cluster_name"]
    for terms in (spec["subnetSelectorTerms"], spec["securityGroupSelectorTerms"]):
        assert terms == [{"tags": {"karpenter.sh/discovery": cluster}}]
    assert spec["metadataOptions"]["httpTokens"] == "required"
    assert all(b["ebs"]["encrypted"] for b in spec["blockDeviceMappings"])
    for engine in example_engines():
        pool = pools[engine.gpu_pool]
        nodepool = nodepools[f"gpu-{engine.gpu_pool}"]
        validate_resource(nodepool)
        template = nodepool["spec"]["template"]
        [dep] = [d for d in documents(rel.engine(engine)) if d["kind"] == "Deployment"]
        pod = pod_spec(dep)
        assert pod["nodeSelector"].items() <= template["metadata"]["labels"].items()
        [taint] = template["spec"]["taints"]
        assert any(t["key"] == taint["key"] and t["effect"] == taint["effect"]
                   for t in pod["tolerations"])  # fmt: skip
        req = {r["key"]: r for r in template["spec"]["requirements"]}
        assert req["node.kubernetes.io/instance-type"]["values"] == pool["instance_types"]
        capacity = {"SPOT": ["spot"], "ON_DEMAND": ["on-demand"]}[pool["capacity_type"]]
        assert req["karpenter.sh/capacity-type"]["values"] == capacity
        assert template["spec"]["nodeClassRef"]["name"] == nodeclass["metadata"]["name"]
        # Consolidation, and a hard cap on what the pool may launch (the budget's guard rail).
        disruption = nodepool["spec"]["disruption"]
        assert disruption["consolidationPolicy"] == "WhenEmptyOrUnderutilized"
        gpus = pool["max_nodes"] * pool["gpus_per_node"]
        assert nodepool["spec"]["limits"] == {"nvidia.com/gpu": str(gpus)}


def test_dev_runs_its_gpu_pool_on_spot_through_karpenter() -> None:
    dev = next(iter(blocks(TERRAFORM / "envs" / "dev", "module").values()))
    prod = next(iter(blocks(TERRAFORM / "envs" / "prod", "module").values()))
    assert unq(dev["gpu_provisioner"]) == "karpenter"
    assert unq(prod["gpu_provisioner"]) == "node_groups"  # capacity blocks, on-demand quota
    assert all(unq(p["capacity_type"]) == "SPOT" for p in unq(dev["gpu_node_groups"]).values())
    # The monthly budget alarm stays on in both.
    for env in ("dev", "prod"):
        assert re.search(r"budget\s*=", folder_text(TERRAFORM / "envs" / env)), env


def test_without_karpenter_no_nodepool_is_rendered() -> None:
    rel = _release("node_groups")
    assert not _docs(rel, "NodePool") and not _docs(rel, "EC2NodeClass")


def test_terraform_wires_karpenter_only_when_chosen() -> None:
    stack = folder_text(TERRAFORM / "stack")
    variable = blocks(TERRAFORM / "stack", "variable")["gpu_provisioner"]
    assert "node_groups" in str(variable["validation"]) and "karpenter" in str(
        variable["validation"]
    )
    assert re.search(r'module "karpenter"', stack)
    assert re.search(r'count\s*=\s*var\.gpu_provisioner\s*==\s*"karpenter"\s*\?\s*1\s*:\s*0', stack)
    for name in ("gpu_provisioner", "karpenter_node_role_name"):
        assert re.search(rf'output "{name}"', stack), name
    module = folder_text(TERRAFORM / "modules" / "karpenter")
    assert "terraform-aws-modules/eks/aws//modules/karpenter" in module
    assert "var.chart_version" in module and "oci://public.ecr.aws/karpenter" in module
    # The controller runs on the platform nodes, never on a node it manages.
    assert '"loraplex.dev/pool" = "platform"' in module
    cluster = folder_text(TERRAFORM / "modules" / "cluster")
    # The managed GPU node groups exist only without Karpenter; subnets and the node security
    # group carry the tag Karpenter discovers them by.
    assert re.search(r'var\.gpu_provisioner\s*==\s*"node_groups"\s*\?\s*local\.gpu_groups', cluster)
    assert '"karpenter.sh/discovery" = var.name' in cluster
    assert '"karpenter.sh/discovery"' in folder_text(TERRAFORM / "modules" / "network")
    # A capacity block is a managed node group's: refused with Karpenter, by name.
    assert "CAPACITY_BLOCK" in str(
        blocks(TERRAFORM / "modules" / "cluster", "variable")["gpu_provisioner"]
    )


def _plan_cluster_variables(tmp_path, **values: object):
    """`terraform plan` of a root holding only the cluster module's variables (the real
    binary evaluates their validations; no provider is needed)."""
    import json
    import shutil
    import subprocess

    import pytest

    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed")
    tmp_path.mkdir(parents=True)
    shutil.copy(TERRAFORM / "modules" / "cluster" / "variables.tf", tmp_path / "variables.tf")
    (tmp_path / "vars.auto.tfvars.json").write_text(json.dumps(values))
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120,
           "env": {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TF_IN_AUTOMATION": "1",
                   "CHECKPOINT_DISABLE": "1"}}  # fmt: skip
    assert (
        subprocess.run([terraform, "init", "-input=false", "-backend=false"], **run).returncode == 0
    )
    return subprocess.run([terraform, "plan", "-input=false", "-no-color"], **run)


def test_a_capacity_block_with_karpenter_is_refused_at_plan_time(tmp_path) -> None:
    pool = {"instance_types": ["p5.48xlarge"], "gpus_per_node": 8, "min_size": 0, "max_size": 1,
            "desired_size": 0, "capacity_type": "CAPACITY_BLOCK", "disk_size_gb": 500,
            "capacity_reservation_id": "cr-0123456789abcdef0"}  # fmt: skip
    values = {
        "name": "loraplex-dev", "kubernetes_version": "1.34", "vpc_id": "vpc-0123456789abcdef0",
        "private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
        "endpoint_public_access_cidrs": ["203.0.113.0/24"],
        "platform_node_group": {"instance_types": ["m7i.xlarge"], "min_size": 2, "max_size": 4,
                                "desired_size": 2, "disk_size_gb": 50},
        "gpu_node_groups": {"h100": pool},
        "addon_versions": {k: "v1.0.0-eksbuild.1" for k in ("coredns", "kube-proxy", "vpc-cni",
                           "aws-ebs-csi-driver", "aws-efs-csi-driver")},
        "device_plugin_chart_version": "0.16.2", "log_retention_days": 30, "tags": {},
    }  # fmt: skip
    ok = _plan_cluster_variables(tmp_path / "ok", **values, gpu_provisioner="node_groups")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _plan_cluster_variables(tmp_path / "bad", **values, gpu_provisioner="karpenter")
    assert bad.returncode != 0
    assert "CAPACITY_BLOCK pool runs on a managed node group" in " ".join(bad.stderr.split())

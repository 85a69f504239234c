"""A first `terraform apply` that can serve: placeholders are refused at plan time (the
environments' variable validations, evaluated by the real `terraform` binary on a root that
holds only those variables: no provider is needed to plan it), the API is served over TLS to
an allowed-CIDR list by default, the add-on Helm releases wait for the node groups, and GPU
capacity is explicit (a capacity block is plumbed to its reservation; prod's GPU pool starts
at zero nodes, since a new account's P-instance quota is 0)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.infra import TERRAFORM, example_outputs, fields, folder_text, parsed, rendered, unq

ENVS = TERRAFORM / "envs"
VALID = {
    "region": "us-east-1",
    "bucket_name": "acme-loraplex-dev",
    "endpoint_public_access_cidrs": ["203.0.113.0/24"],
    "cors_allowed_origins": ["https://console.acme.example"],
    "api_certificate_arn": (
        "arn:aws:acm:us-east-1:730335318842:certificate/8a1c2f3e-0b4d-4c5e-9f60-7a8b9c0d1e2f"
    ),
    "api_allowed_cidrs": ["198.51.100.0/24"],
    "budget_emails": ["ops@acme.example"],
}


def _plan(env: str, tmp_path: Path, **overrides: object) -> subprocess.CompletedProcess:
    """`terraform plan` of a root holding only `env`'s variables, with VALID + overrides."""
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed")
    root = tmp_path / env
    root.mkdir(parents=True)
    shutil.copy(ENVS / env / "variables.tf", root / "variables.tf")
    (root / "vars.auto.tfvars.json").write_text(json.dumps(VALID | overrides))
    run = {"cwd": root, "capture_output": True, "text": True, "timeout": 120,
           "env": {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TF_IN_AUTOMATION": "1",
                   "CHECKPOINT_DISABLE": "1"}}  # fmt: skip
    init = subprocess.run([terraform, "init", "-input=false", "-backend=false"], **run)
    assert init.returncode == 0, init.stdout + init.stderr
    return subprocess.run([terraform, "plan", "-input=false", "-no-color"], **run)


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_placeholders_are_refused_at_plan_time(env: str, tmp_path: Path) -> None:
    ok = _plan(env, tmp_path / "ok")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    placeholders = {
        "api_certificate_arn": [
            "arn:aws:acm:us-east-1:111122223333:certificate/00000000-0000-0000-0000-000000000000",
            "arn:aws:acm:us-east-1:123456789012:certificate/8a1c2f3e-0b4d-4c5e-9f60-7a8b9c0d1e2f",
            "",
        ],
        "api_allowed_cidrs": [[], ["not-a-cidr"]],
    }
    for name, bad_values in placeholders.items():
        for i, bad in enumerate(bad_values):
            done = _plan(env, tmp_path / f"{name}{i}", **{name: bad})
            assert done.returncode != 0, (name, bad)
            assert "Invalid value for variable" in done.stderr and name in done.stderr, done.stderr


def test_the_api_is_served_over_tls_to_the_allowed_cidrs() -> None:
    outputs = example_outputs()
    for env in ("dev", "prod"):
        [ingress] = [d for d in rendered()[f"{env}/platform.yaml"] if d["kind"] == "Ingress"]
        notes = ingress["metadata"]["annotations"]
        assert notes["alb.ingress.kubernetes.io/certificate-arn"] == outputs["api_certificate_arn"]
        assert json.loads(notes["alb.ingress.kubernetes.io/listen-ports"]) == [
            {"HTTP": 80}, {"HTTPS": 443}]  # fmt: skip
        assert notes["alb.ingress.kubernetes.io/ssl-redirect"] == "443"
        cidrs = notes["alb.ingress.kubernetes.io/inbound-cidrs"].split(",")
        assert cidrs == outputs["api_allowed_cidrs"]
    # Nothing left in the values files to hold a certificate (Terraform owns it, validated).
    for env in ("dev", "prod"):
        text = (TERRAFORM.parent / "k8s" / "values" / f"{env}.yaml").read_text()
        assert "certificate_arn" not in text and "111122223333" not in text


def test_addon_releases_wait_for_the_node_groups() -> None:
    stack = parsed(TERRAFORM / "stack" / "main.tf")
    modules = {k: v for m in stack["module"] for k, v in fields(m).items()}
    addons = modules["cluster_addons"]
    assert "module.cluster" in str(addons.get("depends_on")), addons.get("depends_on")


def test_gpu_capacity_is_explicit() -> None:
    for folder in ("modules/cluster", "stack"):
        text = folder_text(TERRAFORM / folder)
        assert "capacity_reservation_id" in text, folder
        assert re.search(r'capacity_type\s*==\s*"CAPACITY_BLOCK"', text), folder
    cluster = (TERRAFORM / "modules" / "cluster" / "main.tf").read_text()
    assert '"capacity-block"' in cluster and "capacity_reservation_target" in cluster
    prod = parsed(ENVS / "prod" / "main.tf")
    [module] = [fields(m)["loraplex"] for m in prod["module"]]
    pools = fields(module["gpu_node_groups"])
    h100 = fields(pools["h100"])
    assert (h100["min_size"], h100["desired_size"]) == (0, 0)
    assert "quota" in (ENVS / "prod" / "main.tf").read_text().lower()
    assert unq(h100["capacity_type"]) in ("ON_DEMAND", "CAPACITY_BLOCK")


def test_a_monthly_budget_alarms_the_operators() -> None:
    """AWS Budgets watches the environment's monthly cost (forecast and actual) and mails the
    operators; each environment sets its amount and recipients."""
    stack = folder_text(TERRAFORM / "stack")
    assert re.search(r'resource "aws_budgets_budget" "monthly"', stack)
    assert re.search(r"limit_amount\s*=\s*tostring\(var\.budget\.monthly_usd\)", stack)
    assert "FORECASTED" in stack and "ACTUAL" in stack
    for env in ("dev", "prod"):
        [module] = [fields(m)["loraplex"] for m in parsed(ENVS / env / "main.tf")["module"]]
        assert "budget" in module, env


def test_dev_gpus_are_spot_and_idle_gpu_nodes_are_consolidated() -> None:
    """The Cluster Autoscaler is the Karpenter equivalent here: dev's GPU pools run on spot
    (several one-GPU types of one GPU model, for availability), and idle or underused nodes
    are given back."""
    [module] = [fields(m)["loraplex"] for m in parsed(ENVS / "dev" / "main.tf")["module"]]
    for name, pool in fields(module["gpu_node_groups"]).items():
        pool = fields(pool)
        assert unq(pool["capacity_type"]) == "SPOT", name
        types = [unq(t) for t in pool["instance_types"]]
        assert len(types) >= 2 and len({t.split(".")[0] for t in types}) == 1, types
    addons = (TERRAFORM / "modules" / "cluster_addons" / "main.tf").read_text()
    assert '"scale-down-utilization-threshold"' in addons
    assert '"scale-down-unneeded-time"' in addons

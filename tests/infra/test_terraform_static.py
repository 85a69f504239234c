"""Static checks of infra/terraform: formatting, parsing, variables, outputs, pins, state.

`terraform init/validate` cannot run here (no provider registry is reachable), so these are
what can be checked offline: every file parses (python-hcl2), every variable is typed,
described, validated and used, every output described, and versions are pinned."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support.infra import (
    ENVS,
    TERRAFORM,
    blocks,
    fields,
    folder_text,
    parsed,
    roots,
    tf_files,
    unq,
)

EXACT = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def test_terraform_fmt_is_clean() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip(
            "the terraform binary is not installed here (fmt needs no registry, but a binary)"
        )
    proc = subprocess.run(
        [terraform, "fmt", "-check", "-recursive", "-diff", str(TERRAFORM)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_tf_file_parses_and_every_module_folder_has_the_usual_files() -> None:
    assert len(tf_files()) >= 40
    for path in tf_files():
        assert isinstance(parsed(path), dict), path
    for folder in roots():
        names = {p.name for p in folder.glob("*.tf")}
        assert {"main.tf", "versions.tf"} <= names or folder.name == "bootstrap", folder
        if folder.name != "bootstrap":
            assert {"variables.tf", "outputs.tf"} <= names, folder


def test_every_variable_is_typed_described_validated_and_used() -> None:
    for folder in roots():
        text = folder_text(folder)
        for name, body in blocks(folder, "variable").items():
            where = f"{folder.relative_to(TERRAFORM)}: variable {name}"
            assert body.get("type"), f"{where} has no type"
            assert len(unq(body.get("description", ""))) >= 10, f"{where} is not described"
            # A bool has no invalid value to refuse.
            assert body.get("validation") or body["type"] == "bool", f"{where} is not validated"
            uses = len(re.findall(rf"\bvar\.{name}\b", text))
            assert uses >= 1, f"{where} is never used"


def test_every_output_is_described_and_the_envs_forward_every_stack_output() -> None:
    for folder in roots():
        for name, body in blocks(folder, "output").items():
            assert len(unq(body.get("description", ""))) >= 10, f"{folder}: output {name}"
    stack = set(blocks(TERRAFORM / "stack", "output"))
    for env in ENVS:
        outs = blocks(TERRAFORM / "envs" / env, "output")
        assert set(outs) == stack, env
        for name, body in outs.items():
            assert body["value"] == f"${{module.loraplex.{name}}}", (env, name)


def test_module_and_provider_versions_are_pinned() -> None:
    registry_modules = 0
    for folder in roots():
        for name, body in blocks(folder, "module").items():
            source = unq(body["source"])
            if source.startswith("terraform-aws-modules/"):
                registry_modules += 1
                assert EXACT.match(unq(body.get("version", ""))), f"{folder}: module {name}"
            else:
                assert source.startswith("../"), f"{folder}: module {name} from {source}"
    assert registry_modules >= 15
    for root in [TERRAFORM / "envs" / e for e in ENVS] + [TERRAFORM / "bootstrap"]:
        [terraform] = [t for p in root.glob("*.tf") for t in parsed(p).get("terraform", [])
                       if "required_providers" in t]  # fmt: skip
        for providers in terraform["required_providers"]:
            for provider, spec in fields(providers).items():
                assert EXACT.match(unq(spec["version"])), f"{root}: provider {provider} {spec}"
    # Helm charts and EKS add-ons are pinned to exact versions in the envs.
    for env in ENVS:
        [module] = blocks(TERRAFORM / "envs" / env, "module").values()
        for chart, version in fields(module["chart_versions"]).items():
            assert EXACT.match(unq(version)), (env, chart)
        for addon, version in fields(module["addon_versions"]).items():
            assert re.match(r"^v[0-9]+\.[0-9]+\.[0-9]+-eksbuild\.[0-9]+$", unq(version)), (
                env,
                addon,
            )


def test_envs_keep_remote_state_in_s3_with_locking() -> None:
    for env in ENVS:
        [backend] = [b for p in (TERRAFORM / "envs" / env).glob("*.tf")
                     for t in parsed(p).get("terraform", []) for b in t.get("backend", [])]  # fmt: skip
        s3 = fields(backend)["s3"]
        assert s3["use_lockfile"] is True and s3["encrypt"] is True, env
        assert unq(s3["key"]) == f"loraplex/{env}/terraform.tfstate"


def test_prod_is_the_resilient_environment() -> None:
    """Multi-AZ database with deletion protection, a replica cache, NAT per zone in prod."""
    modules = {env: next(iter(blocks(TERRAFORM / "envs" / env, "module").values())) for env in ENVS}
    prod, dev = modules["prod"], modules["dev"]
    assert prod["database"]["multi_az"] is True and prod["database"]["deletion_protection"] is True
    assert prod["cache"]["replicas"] >= 1 and prod["single_nat_gateway"] is False
    assert dev["database"]["multi_az"] is False
    for m in modules.values():
        assert int(unq(m["database"]["engine_version"]).split(".")[0]) >= 16

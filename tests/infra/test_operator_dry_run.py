"""The operator dry run: infra/README.md's "Apply" section, executed as written in one bash
shell, from a copy of the repository, with the cloud and cluster commands (`terraform`, `aws`,
`kubectl`, `docker`, `curl`, the editor) replaced by recorders (`support.operator_recorders`)
that check every file, Terraform output and variable, Kubernetes object and `loraplex`
command a step names. Everything else runs for real: the renderer, `deploy.sh`, the engine
tag, the shell's own variables and files. It must end in a streamed completion."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import support.operator_recorders as recorders
from support.infra import EXAMPLE_OUTPUTS, INFRA, REPO

README = INFRA / "README.md"
TOOLS = ("terraform", "aws", "kubectl", "docker", "curl", "editor")
CODE = ("platform", "adapters", "moe", "loader", "api", "migrations")
TFVARS = {
    "region": "us-east-1",
    "bucket_name": "acme-loraplex-dev",
    "endpoint_public_access_cidrs": ["203.0.113.0/24"],
    "cors_allowed_origins": ["https://loraplex-dev.example.com"],
    "api_certificate_arn": (
        "arn:aws:acm:us-east-1:730335318842:certificate/8a1c2f3e-0b4d-4c5e-9f60-7a8b9c0d1e2f"
    ),
    "api_allowed_cidrs": ["198.51.100.0/24"],
    "budget_emails": ["ops@acme.example"],
}


def apply_section(text: str) -> str:
    """The shell blocks of the README's "Apply" section, in order, as one script."""
    section = text.split("\n## Apply\n", 1)[1].split("\n### Private endpoint", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) >= 9, "the Apply section lost its steps"
    return "set -euo pipefail\n" + "\n".join(blocks)


def dry_run(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """Run `script` in a copy of the repository with the recorders first on PATH."""
    work, state, bin_dir = tmp_path / "repo", tmp_path / "state", tmp_path / "bin"
    for d in (work, state, bin_dir):
        d.mkdir()
    shutil.copytree(INFRA, work / "infra", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, work / name)
    for name in CODE:
        (work / name).symlink_to(REPO / name)
    model = work / "llama-8b"  # the operator's Hugging Face folder
    model.mkdir()
    (model / "config.json").write_text("{}")
    for tool in TOOLS:
        wrapper = bin_dir / tool
        wrapper.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{recorders.__file__}" {tool} "$@"\n'
        )
        wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORAPLEX_", "AWS_"))}
    env |= {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "EDITOR": str(bin_dir / "editor"),
        "DRY_RUN_DIR": str(state),
        "DRY_RUN_OUTPUTS": str(EXAMPLE_OUTPUTS),
        "DRY_RUN_TFVARS": json.dumps(TFVARS),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    return subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip


def _calls(tmp_path: Path) -> list[dict]:
    log = tmp_path / "state" / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.timeout(600)
def test_the_readme_walks_from_an_empty_account_to_a_streamed_completion(tmp_path: Path) -> None:
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (a prerequisite the README names)")
    done = dry_run(tmp_path, apply_section(README.read_text()))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "data: [DONE]" in done.stdout
    calls = _calls(tmp_path)
    said = [(c["tool"], " ".join(c["args"])) for c in calls]

    def index(tool: str, pattern: str) -> int:
        hits = [i for i, (t, a) in enumerate(said) if t == tool and re.search(pattern, a)]
        assert hits, (tool, pattern)
        return hits[0]

    order = [
        index("terraform", r"bootstrap apply"),
        index("terraform", r"envs/dev apply"),
        index("docker", r"^push .*/platform:v1\.2\.0$"),
        index("docker", r"^push .*/engine:engine-[0-9a-f]{12}$"),
        index("kubectl", r"^apply -f -"),  # deploy.sh: the platform
        index("kubectl", r"wait .*job/loraplex-migrate-v1-2-0"),
        index("kubectl", r"models add llama-8b"),
        index("kubectl", r"deployments create llama-8b"),
        index("kubectl", r"keys create acme"),
        index("curl", r"/v1/chat/completions"),
    ]
    assert order == sorted(order), order
    # The deploy rendered the engine image tag the build pushed (no release-tagged engine).
    pushed = next(a for t, a in said if t == "docker" and "/engine:" in a).split(":")[-1]
    launcher = json.loads((tmp_path / "state" / "state.json").read_text())
    assert ["Deployment", "loraplex-launcher"] in launcher["applied"]
    deploy_cmds = [c for c in calls if c["tool"] == "terraform" and "output" in c["args"]]
    assert deploy_cmds and pushed.startswith("engine-")


def test_the_models_admin_pod_fits_a_platform_node() -> None:
    """Its ephemeral storage (request and limit) leaves a fifth of the platform node's disk
    to images and the system, in every environment."""
    from support.infra import TERRAFORM, fields, parsed, rendered

    for env in ("dev", "prod"):
        [module] = [
            fields(m)["loraplex"] for m in parsed(TERRAFORM / "envs" / env / "main.tf")["module"]
        ]
        disk_gb = fields(module["platform_node_group"])["disk_size_gb"]
        [pod] = rendered()[f"{env}/models-admin.yaml"]
        for bound in ("requests", "limits"):
            quantity = pod["spec"]["containers"][0]["resources"][bound]["ephemeral-storage"]
            gib = int(quantity.removesuffix("Gi"))
            assert gib * 1.074 <= 0.8 * disk_gb, (env, bound, quantity, disk_gb)


@pytest.mark.parametrize(
    ("broken", "replacement", "reason"),
    [
        ("output -json > out.json", "output -json > outputs.json", "out.json"),
        ("-var state_bucket_name=", "-var bucket_name=", "undeclared variables"),
        ("loraplex deployments create llama-8b", "loraplex deployment create llama-8b", "CLI"),
    ],
)  # fmt: skip
def test_the_dry_run_fails_on_a_step_that_names_what_does_not_exist(
    tmp_path: Path, broken: str, replacement: str, reason: str
) -> None:
    """Control: each kind of mistake the issue names (a file, an output, a variable, a
    command) stops the dry run with the recorder's reason."""
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed")
    script = apply_section(README.read_text())
    assert broken in script, broken
    done = dry_run(tmp_path, script.replace(broken, replacement, 1))
    assert done.returncode != 0
    assert reason in done.stderr, done.stderr[-2000:]

"""checkov over the Terraform, the Dockerfiles and every rendered Kubernetes manifest: no
failed check; each skipped one is skipped in the code with a written reason.

checkov lives in its own venv (`make` builds .venv-checkov: its pins conflict with ours)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.infra import INFRA, REPO, rendered_texts


def _checkov() -> str | None:
    local = REPO / ".venv-checkov" / "bin" / "checkov"
    return str(local) if local.exists() else shutil.which("checkov")


def _reports(text: str) -> list[dict]:
    """checkov prints one JSON value per scanned root; each is a report or a list of them."""
    decoder, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        value, i = decoder.raw_decode(text, i)
        out.extend(value if isinstance(value, list) else [value])
    return out


def test_checkov_finds_no_failed_check(tmp_path: Path) -> None:
    checkov = _checkov()
    if checkov is None:
        if os.environ.get("CI"):
            pytest.fail("checkov is not installed: `make test` builds .venv-checkov")
        pytest.skip("checkov is not installed (make test builds .venv-checkov)")
    # One root holding the three kinds: with several -d roots checkov scans each with every
    # framework (three times the work).
    shutil.copytree(INFRA / "terraform", tmp_path / "terraform")
    shutil.copytree(INFRA / "docker", tmp_path / "docker")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for name, text in rendered_texts().items():
        (manifests / name.replace("/", "-")).write_text(text)
    proc = subprocess.run(
        [checkov, "--quiet", "--compact", "--skip-download", "-o", "json",
         "--framework", "terraform", "dockerfile", "kubernetes",
         "-d", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )  # fmt: skip
    reports = _reports(proc.stdout)
    assert reports, proc.stderr[-2000:]
    failed, passed, skipped = [], {}, []
    for r in reports:
        passed[r["check_type"]] = passed.get(r["check_type"], 0) + r["summary"]["passed"]
        failed += [f"{r['check_type']} {c['check_id']} {c['resource']} {c['file_path']}: "
                   f"{c['check_name']}" for c in r["results"].get("failed_checks", [])]  # fmt: skip
        skipped += r["results"].get("skipped_checks", [])
    assert not failed, "\n".join(sorted(set(failed)))
    # Every framework really scanned something (a wrong path would pass vacuously).
    assert passed.get("terraform", 0) > 50 and passed.get("kubernetes", 0) > 100, passed
    assert passed.get("dockerfile", 0) > 10, passed
    for c in skipped:
        reason = (c.get("suppress_comment") or "").strip()
        assert len(reason) >= 20, f"{c['check_id']} on {c['resource']} is skipped without a reason"

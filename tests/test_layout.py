"""The repository layout: `platform/` maps to `loraplex.platform` without shadowing the
standard library's `platform` module for Python started at the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_platform_folder_has_no_init() -> None:
    assert (REPO / "platform").is_dir()
    assert not (REPO / "platform" / "__init__.py").exists()


def test_stdlib_platform_wins_at_repo_root() -> None:
    code = (
        "import platform, sysconfig, pathlib;"
        "print(platform.system());"
        "print(pathlib.Path(platform.__file__).resolve().parent == "
        "pathlib.Path(sysconfig.get_path('stdlib')).resolve())"
    )
    # `-c` puts the current directory first on sys.path: the case the layout must survive.
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    system, from_stdlib = out.stdout.split()
    assert system in {"Linux", "Darwin", "Windows"}
    assert from_stdlib == "True"


def test_loraplex_platform_imports_from_the_folder() -> None:
    code = "import loraplex.platform, loraplex.platform.settings as s;print(s.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() == REPO / "platform" / "settings.py"


def test_loraplex_folder_links_every_part_for_import_linter() -> None:
    """`loraplex/` at the root holds one relative link per part of the distribution (setup.py's
    PARTS, and `infra` it maps by hand) and nothing else: what plain `lint-imports` and mypy
    walk, so a new part needs its link."""
    from support.import_tree import linked_parts

    links = {p.name: p for p in (REPO / "loraplex").iterdir()}
    assert set(links) == set(linked_parts())
    assert "infra" in links
    for name, link in links.items():
        assert link.is_symlink() and str(link.readlink()) == f"../{name}"
        assert link.resolve() == REPO / name


RUNTIME_PARTS = ("platform", "adapters", "moe", "loader", "api")


def test_benchmarks_are_their_own_part_outside_the_runtime() -> None:
    """The benchmarks (`loraplex bench NAME`) are the `bench/` part, `loraplex.bench`: none of
    the runtime parts ships a benchmark module (import contract `bench-outside-runtime`)."""
    from support.import_tree import parts

    assert "bench" in parts()
    assert (REPO / "bench" / "__init__.py").is_file()
    inside = [
        str(p.relative_to(REPO))
        for part in RUNTIME_PARTS
        for p in (REPO / part).rglob("bench")
        if p.is_dir()
    ]
    assert inside == []


def test_cuda_graph_capture_lives_with_the_engine() -> None:
    """Graph capture replays the engine's decode step, so it is the engine's
    (`platform/engine/cuda_graphs.py`); the loader only streams weights in."""
    assert (REPO / "platform" / "engine" / "cuda_graphs.py").is_file()
    capturing = [
        str(p.relative_to(REPO))
        for p in (REPO / "loader").rglob("*.py")
        if any(word in p.read_text() for word in ("CUDAGraph", "torch.cuda.graph"))
    ]
    assert capturing == []

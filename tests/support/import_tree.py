"""Run import-linter: `lint_imports` runs `lint-imports` with a root first on the path, and
`package_tree` lays a package out as one folder for it. The project needs no tree of its own:
the repository's `loraplex/` folder links each part (setup.py's `PARTS`) so that plain
`lint-imports` at the repository root finds the package the editable install hides from it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def parts(names: tuple[str, ...] = ("PARTS", "OPTIONAL_PARTS")) -> list[str]:
    """The top-level folders that make up `loraplex` (setup.py's PARTS, the runtime, and its
    OPTIONAL_PARTS, the benchmarks a source checkout installs too)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    found = {
        node.targets[0].id: list(ast.literal_eval(node.value))
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in names
    }
    if "PARTS" in names and "PARTS" not in found:
        raise AssertionError("setup.py has no PARTS list")
    return [part for name in names for part in found.get(name, [])]


def linked_parts() -> list[str]:
    """What the root's `loraplex/` folder links: setup.py's PARTS and the parts it maps by hand
    (`package_dir["loraplex.infra"] = "infra"`: only infra/'s Kubernetes renderer is Python)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    by_hand = [
        node.targets[0].slice.value.removeprefix("loraplex.")
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Subscript)
        and getattr(node.targets[0].value, "id", None) == "package_dir"
        and isinstance(node.targets[0].slice, ast.Constant)
    ]
    return [*parts(), *by_hand]


def package_tree(root: Path, name: str, folders: dict[str, Path]) -> Path:
    """`root/name/` with one entry per folder: a symlink for a regular package, a real folder
    of symlinks (plus an empty __init__.py) for a namespace portion such as `platform/`."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").touch()
    for part, src in folders.items():
        if (src / "__init__.py").exists():
            (pkg / part).symlink_to(src, target_is_directory=True)
            continue
        (pkg / part).mkdir()
        (pkg / part / "__init__.py").touch()
        for entry in src.iterdir():
            if entry.name != "__pycache__":
                (pkg / part / entry.name).symlink_to(entry)
    return root


def lint_imports(path_root: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports CONFIG` with `path_root` first on the path; exit status 0: all kept."""
    env = {**os.environ, "PYTHONPATH": str(path_root)}
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--no-cache", "--no-logo", str(config)],
        cwd=path_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

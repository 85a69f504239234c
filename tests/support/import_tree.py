"""Run import-linter on the project: `loraplex` is one distribution spread over top-level
folders (setup.py `package-dir`), which import-linter cannot walk, so `loraplex_tree` lays the
package out as one folder of symlinks, and `lint_imports` runs `lint-imports` over it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def parts() -> list[str]:
    """The top-level folders that make up `loraplex` (setup.py's PARTS)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PARTS":
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no PARTS list")


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


def loraplex_tree(root: Path) -> Path:
    """The `loraplex` package as one folder under `root` (returns `root`, for PYTHONPATH)."""
    return package_tree(root, "loraplex", {p: REPO / p for p in parts()})


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


def main() -> int:
    """`python tests/support/import_tree.py`: the project's contracts over a symlink tree (plain
    `lint-imports` cannot walk the package-dir layout); `make lint` runs this."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        done = lint_imports(loraplex_tree(Path(tmp)), REPO / "pyproject.toml")
    print(done.stdout + done.stderr, end="")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())

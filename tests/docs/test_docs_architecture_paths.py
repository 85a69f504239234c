"""`docs/architecture.md` describes today's files: every repository path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
# The doc names files from the root (`api/routes/openai.py`) or, in a part's row and in the
# request walk-through, from inside a part (`gateway/router.py` is `platform/gateway/router.py`,
# `lora/runtime.py` the engine's, `static/vendor/` the console's).
BASES = (
    "",
    "platform",
    "platform/engine",
    "api",
    "api/console",
    "adapters",
    "moe",
    "loader",
    "tests",
    "tests/support",
)
_CODE = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"[\w.*-]+(?:/[\w.*-]+)*/?")
_EXTENSIONS = (".py", ".md", ".toml", ".c", ".j2", ".yaml", ".ini", ".html")


def named_paths(text: str) -> list[str]:
    """The code spans of `text` that read as repository paths: a folder or file with a `/`
    (not a URL route such as `/state`), or a file name with a known extension."""
    out = []
    for span in _CODE.findall(text):
        if not _PATH.fullmatch(span) or span.startswith("/"):
            continue
        if "/" in span or span.endswith(_EXTENSIONS):
            out.append(span)
    return out


def exists(path: str) -> bool:
    """Whether `path` names a file or folder under one of `BASES` (a module may leave out
    `.py`; a bare file name may sit anywhere in a part; `*` is a glob)."""
    for base in BASES:
        root = REPO / base
        if "/" not in path.rstrip("/") and base:
            found = root.rglob(path)
        else:
            found = root.glob(path.rstrip("/")) if "*" in path else iter([root / path.rstrip("/")])
        for hit in found:
            if hit.exists() or hit.with_suffix(".py").exists():
                return True
    return False


def test_the_path_finder_reads_paths_and_skips_routes_and_names() -> None:
    text = "`api/app.py`, `gateway/` and `pages_*.py`; `/state`, `Settings.storage()`, `a b`"
    assert named_paths(text) == ["api/app.py", "gateway/", "pages_*.py"]
    assert exists("gateway/router.py") and exists("platform/errors") and exists("pages_*.py")
    assert not exists("gateway/no_such_module.py") and not exists("no_such_file.py")


def test_every_path_the_architecture_doc_names_exists() -> None:
    missing = sorted({p for p in named_paths(DOC.read_text()) if not exists(p)})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"

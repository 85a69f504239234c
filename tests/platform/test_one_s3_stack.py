"""One S3 stack (issue 28): one module builds boto3 clients, recognises a missing object and
does ranged reads; everything else (control plane, gateway, embedded services) goes through it.

Read from the package's syntax trees, so a second client factory or a second copy of the
not-found codes anywhere in the shipped package fails here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ("adapters", "api", "loader", "moe", "platform", "migrations")
OWNER = "loader/object_store.py"


def _modules() -> dict[str, ast.AST]:
    out = {}
    for part in PARTS:
        for path in sorted((REPO / part).rglob("*.py")):
            out[str(path.relative_to(REPO))] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def _builds_client(node: ast.AST) -> bool:
    """`boto3.client(...)`, `boto3.resource(...)` or `<session>.client("s3", ...)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr not in ("client", "resource"):
        return False
    base = node.func.value
    if isinstance(base, ast.Name) and base.id == "boto3":
        return True
    first = node.args[0] if node.args else None
    return isinstance(first, ast.Constant) and first.value == "s3"


def test_exactly_one_module_builds_s3_clients() -> None:
    builders = {rel for rel, tree in _modules().items() if any(map(_builds_client, ast.walk(tree)))}
    assert builders == {OWNER}


def test_exactly_one_module_knows_the_not_found_codes_and_ranges() -> None:
    """The error codes of a missing object, and the `Range=` of a ranged GET, live in the owner."""
    codes, ranges = set(), set()
    for rel, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in ("NoSuchKey", "NoSuchUpload"):
                codes.add(rel)
            if isinstance(node, ast.keyword) and node.arg == "Range":
                ranges.add(rel)
    assert codes == {OWNER}
    assert ranges == {OWNER}


def test_the_owner_stays_torch_free_and_below_the_platform() -> None:
    tree = _modules()[OWNER]
    imported = {
        alias.name if isinstance(n, ast.Import) else (n.module or "")
        for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
        for alias in n.names
    }  # fmt: skip
    assert not any(m == "torch" or m.startswith(("torch.", "loraplex.platform")) for m in imported)

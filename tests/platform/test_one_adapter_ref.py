"""`AdapterRef` is defined once: the wire's versioned model, which the engine uses as it is.

The engine kept a dataclass of its own with the same fields, built from the wire's in
`wire_mapping` and checked again field by field (hex digests, lengths, types) after pydantic
had checked them. Now the wire model is the one class; the engine adds only the checks the
wire's field constraints cannot express (resolved targets present and well formed, no `..`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from loraplex.adapters.identity import adapter_ref_key
from loraplex.platform.engine.lora import AdapterRef as EngineAdapterRef
from loraplex.platform.engine.lora.sources import AdapterRef as SourcesAdapterRef
from loraplex.platform.engine.wire_mapping import adapter_reference
from loraplex.platform.wire import AdapterRef

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("platform", "adapters", "loader", "moe", "api")
SHA = "ab" * 32


def test_one_class_named_adapter_ref_in_the_package() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for part in PARTS
        for path in (ROOT / part).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "AdapterRef"
    ]
    assert found == ["platform/wire/messages.py:" + found[0].rsplit(":", 1)[1]], found


def test_the_engine_uses_the_wire_class_as_it_is() -> None:
    assert EngineAdapterRef is AdapterRef and SourcesAdapterRef is AdapterRef
    ref = AdapterRef(object_prefix="t/a/v1/", sha256=SHA, targets={"format": 1})
    assert adapter_reference(ref) is ref  # the one mapping place maps nothing
    assert adapter_reference(None) is None


def test_the_key_and_the_engine_checks() -> None:
    ref = AdapterRef(object_prefix="t/a/v1/", sha256=SHA.upper(), config_sha256=SHA)
    assert ref.key == adapter_ref_key(SHA.upper(), SHA)
    with pytest.raises(ValueError, match="no resolved targets"):
        ref.check()
    bad = AdapterRef(object_prefix="t/../v1/", sha256=SHA, targets={"format": 1, "groups": []})
    with pytest.raises(ValueError, match=r"\.\."):
        bad.check()

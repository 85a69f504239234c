"""The quantization choices are named in one place (issue 28: "quantization rules in six
places, including the loader/quantize.py shim").

The names live in `loraplex.loader.quant_choices` (torch-free, and in the lowest layer: the
loader parses the choices too, and may not import the platform); the platform reads them
through `platform/engine_spec/quantization.py`, which owns the rules over them. Read from the
package's syntax trees: a collection literal (tuple, list, set, dict, `Literal[...]`) naming two
or more choices, one of them a choice rather than a storage kind (int4_sym, awq, gptq), is a
second list. Alembic revisions are history (each keeps the values of its day) and are skipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PARTS = ("adapters", "api", "loader", "moe", "platform")
OWNER = "loader/quant_choices.py"
CHOICES = {"fp32", "bf16", "fp16", "fp8", "int8", "int4", "int4_sym", "awq", "gptq"}
CHOICE_ONLY = {"int4_sym", "awq", "gptq"}


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items: list[ast.expr | None] = list(node.elts)
    elif isinstance(node, ast.Dict):
        items = [*node.keys, *node.values]
    else:
        return set()
    return {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def _listings() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for part in PARTS:
        for path in sorted((REPO / part).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = _strings(node) & CHOICES
                if len(names) >= 2 and names & CHOICE_ONLY:
                    found.setdefault(rel, []).append(node.lineno)
    return found


def test_only_the_owner_lists_the_quantization_choices() -> None:
    assert set(_listings()) == {OWNER}, _listings()


def test_the_shim_is_gone_and_the_platform_reads_the_owner() -> None:
    assert not (REPO / "loader" / "quantize.py").exists()
    from loraplex.loader import quant_choices
    from loraplex.platform.db import models
    from loraplex.platform.engine_spec import quantization, supported_models

    assert quantization.WEIGHT_CHOICES is quant_choices.WEIGHT_CHOICES
    assert models.WEIGHT_QUANTIZATIONS == quant_choices.WEIGHT_CHOICES
    assert models.KV_CACHE_DTYPES == quant_choices.KV_CACHE_CHOICES
    assert set(supported_models.SERVED_WEIGHT_QUANTIZATIONS) <= set(quant_choices.WEIGHT_CHOICES)


def test_the_api_accepts_exactly_the_choices() -> None:
    import pytest
    from pydantic import ValidationError

    from loraplex.api.schemas import Quantization
    from loraplex.loader.quant_choices import KV_CACHE_CHOICES, WEIGHT_CHOICES

    for choice in WEIGHT_CHOICES:
        assert Quantization(weights=choice).weights == choice
    for kv in KV_CACHE_CHOICES:
        assert Quantization(kv_cache=kv).kv_cache == kv
    with pytest.raises(ValidationError):
        Quantization(weights="int3")
    schema = Quantization.model_json_schema()["properties"]
    assert schema["weights"]["enum"] == list(WEIGHT_CHOICES)

"""`docs/architecture.md` draws the layers from the import contracts: every contract in
pyproject.toml's `[tool.importlinter]` is named there, and each layers contract is drawn as a
block listing its layers top to bottom exactly as the contract orders them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"


def contracts() -> list[dict[str, Any]]:
    """The import-linter contracts, in the order pyproject.toml lists them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(config["tool"]["importlinter"]["contracts"])


def drawn_layers(text: str, contract_id: str) -> list[str] | None:
    """The lines of the fenced block under the heading that names `contract_id`, or None."""
    pattern = rf"^#+ [^\n]*`{re.escape(contract_id)}`[^\n]*\n+```[a-z]*\n(.*?)\n```"
    found = re.search(pattern, text, re.M | re.S)
    if found is None:
        return None
    return [line.strip() for line in found.group(1).splitlines() if line.strip()]


def test_every_contract_is_named_in_the_doc() -> None:
    text = DOC.read_text()
    missing = [c["id"] for c in contracts() if f"`{c['id']}`" not in text]
    assert not missing, f"docs/architecture.md does not name these import contracts: {missing}"


def test_every_layers_contract_is_drawn_in_its_order() -> None:
    text = DOC.read_text()
    layered = [c for c in contracts() if c["type"] == "layers"]
    assert len(layered) >= 3
    for contract in layered:
        assert drawn_layers(text, contract["id"]) == contract["layers"], contract["id"]


def test_a_drawing_out_of_order_is_caught() -> None:
    doc = "### `demo`: parts\n\n```text\nloraplex.api\nloraplex.platform\n```\n"
    assert drawn_layers(doc, "demo") == ["loraplex.api", "loraplex.platform"]
    assert drawn_layers(doc, "other") is None

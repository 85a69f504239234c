"""The README's table of OpenAI request fields says what `openai_fields` and the request models
do: every served field, every field accepted in one value, and every refused field is listed,
and the table names no field the code does not know."""

from __future__ import annotations

import re
from pathlib import Path

from loraplex.platform.gateway.openai_fields import ACCEPTED_VALUES, REFUSED
from loraplex.platform.gateway.openai_schemas import ChatCompletionRequest, CompletionRequest

README = Path(__file__).resolve().parents[3] / "README.md"


def _table() -> dict[str, str]:
    text = README.read_text()
    block = text.split("<!-- openai-fields -->", 1)[1].split("<!-- /openai-fields -->", 1)[0]
    rows: dict[str, str] = {}
    for line in block.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[name] = cells[2]
    return rows


def test_readme_table_matches_the_code() -> None:
    rows = _table()
    served = {f.alias or n for m in (ChatCompletionRequest, CompletionRequest)
              for n, f in m.model_fields.items()}  # fmt: skip
    for name in REFUSED:
        assert rows.get(name, "").startswith("refused"), name
    for name in ACCEPTED_VALUES:
        assert rows.get(name, "").startswith("only"), name
    for name in served - {"echo", "suffix"}:
        assert rows.get(name, "").startswith(("served", "accepted")), name
    assert set(rows) == served | set(REFUSED) | set(ACCEPTED_VALUES)

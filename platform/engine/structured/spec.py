"""GrammarSpec: one request's output constraint, and its llguidance grammar text."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from loraplex.platform.wire.grammar import grammar_text

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must match: `kind` (see `KINDS`) reads `value` or `choices`."""

    kind: str
    value: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "choice" and not self.choices:
            raise ValueError("a choice constraint needs at least one choice")

    @property
    def key(self) -> str:
        """The content hash compiled grammars are cached under."""
        body = json.dumps([self.kind, self.value, list(self.choices)], ensure_ascii=False)
        return hashlib.sha256(body.encode()).hexdigest()

    def grammar(self) -> str:
        """The llguidance grammar text (raises ValueError for input that cannot be read)."""
        return grammar_text(self.kind, self.value, self.choices)

"""GrammarSpec: one request's output constraint, and its llguidance grammar text."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")
# Compact JSON: no free whitespace between tokens (a model could otherwise emit spaces until
# max_tokens), and unknown schema keywords refused instead of ignored.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "lenient": False}


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
        """The llguidance grammar text (raises ValueError for a schema that is not JSON)."""
        from llguidance import LLMatcher

        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("the JSON schema must be an object")
            return LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.value)
        if self.kind == "grammar":
            return LLMatcher.grammar_from_lark(self.value)
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in self.choices)
        return LLMatcher.grammar_from_lark(f"start: {alternatives}")

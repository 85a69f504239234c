"""A `StructuredOutput` as llguidance grammar text, and its validity: one definition for the
gateway (which refuses a bad constraint with a 400 before routing) and the replica (which
compiles it against its tokenizer). llguidance is imported on first use; it needs no torch."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact JSON: no free whitespace between tokens (a model could otherwise emit spaces until
# max_tokens), and unknown schema keywords refused instead of ignored.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "lenient": False}


def grammar_text(kind: str, value: str = "", choices: tuple[str, ...] | list[str] = ()) -> str:
    """llguidance grammar text for a constraint (raises ValueError when `value` cannot be
    read: a schema that is not JSON, a grammar that does not parse)."""
    from llguidance import LLMatcher

    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
    if kind == "json_schema":
        try:
            schema = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("the JSON schema must be an object")
        # A boolean schema (true: anything, false: nothing) goes as its JSON text.
        text_or_doc = schema if isinstance(schema, dict) else json.dumps(schema)
        return LLMatcher.grammar_from_json_schema(text_or_doc, JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(value)
    if kind == "grammar":  # Lark, or GBNF (`root ::= ...`, what vLLM's xgrammar takes)
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(value)
        except Exception as exc:  # noqa: BLE001 - the converter's own parse errors
            raise ValueError(f"invalid grammar: {exc}") from None
        return LLMatcher.grammar_from_lark(lark)
    if kind == "choice":
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        return LLMatcher.grammar_from_lark(f"start: {alternatives}")
    raise ValueError(f"unknown structured output kind {kind!r}")


def grammar_error(kind: str, value: str = "", choices: tuple[str, ...] | list[str] = ()) -> str:
    """Why the constraint cannot be compiled ("" when it can): unreadable input, an invalid
    regex or grammar, or a JSON-schema keyword the grammar engine does not implement (cached by
    content, like the replica's compiled grammars)."""
    return _grammar_error(kind, value, tuple(choices))


@functools.lru_cache(maxsize=256)
def _grammar_error(kind: str, value: str, choices: tuple[str, ...]) -> str:
    from llguidance import LLMatcher

    try:
        text = grammar_text(kind, value, choices)
        is_error, messages = LLMatcher.validate_grammar_with_warnings(text)
    except Exception as exc:  # noqa: BLE001 - any failure to read it is the caller's input
        return str(exc) or type(exc).__name__
    if is_error:
        return messages[0] if messages else "invalid constraint"
    return ""

"""Tool calls in a model's free output, read in the format its chat template teaches it.

Families (chosen from the chat template's text, or named by a deployment option):
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5, Qwen3);
- `llama3_json`: the whole reply is `{"name": ..., "parameters": {...}}` (Llama 3.1/3.2),
  optionally after `<|python_tag|>`, several calls separated by `;`;
- `qwen3_xml`: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function>
  </tool_call>` (Qwen3-Coder).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

FAMILIES = ("hermes", "llama3_json", "qwen3_xml")


@dataclass(frozen=True)
class ParsedToolCall:
    """One call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


def tool_call_family(template_source: str) -> str | None:
    """The tool-call format a chat template teaches (None when it shows none)."""
    if "<function=" in template_source:
        return "qwen3_xml"
    if "<tool_call>" in template_source:
        return "hermes"
    if "<|python_tag|>" in template_source or "ipython" in template_source:
        return "llama3_json"
    return None


def parse_tool_calls(text: str, family: str) -> tuple[str | None, list[ParsedToolCall]]:
    """(content outside the calls or None, the calls) of `text`; no calls when the text does
    not hold a well-formed one (then the whole text is content)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tool-call family {family!r}; one of {FAMILIES}")
    parse = {"hermes": _hermes, "llama3_json": _llama3, "qwen3_xml": _qwen3_xml}[family]
    calls, rest = parse(text)
    if not calls:
        return text, []
    rest = rest.strip()
    return (rest or None), calls


def _call(obj: Any, args_key: str) -> ParsedToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _hermes(text: str) -> tuple[list[ParsedToolCall], str]:
    calls = []
    for body in _HERMES.findall(text):
        try:
            call = _call(json.loads(body), "arguments")
        except json.JSONDecodeError:
            return [], text
        if call is None:
            return [], text
        calls.append(call)
    return calls, _HERMES.sub("", text)


def _llama3(text: str) -> tuple[list[ParsedToolCall], str]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return [], text
    calls = []
    decoder = json.JSONDecoder()
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return [], text
        call = _call(obj, "parameters")
        if call is None:
            return [], text
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \n\t;":
            pos += 1
    return calls, ""


_QWEN_CALL = re.compile(
    r"<tool_call>\s*<function=([^>\s]+)>(.*?)</function>\s*</tool_call>", re.DOTALL
)
_QWEN_PARAM = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _qwen3_xml(text: str) -> tuple[list[ParsedToolCall], str]:
    calls = []
    for name, body in _QWEN_CALL.findall(text):
        args: dict[str, Any] = {}
        for key, raw in _QWEN_PARAM.findall(body):
            try:
                args[key] = json.loads(raw)
            except json.JSONDecodeError:
                args[key] = raw  # a bare string value
        calls.append(ParsedToolCall(name, json.dumps(args, ensure_ascii=False)))
    return calls, _QWEN_CALL.sub("", text)

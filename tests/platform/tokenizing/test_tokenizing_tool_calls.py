"""Tool calls parsed from free output in each chat-template family's own format."""

from __future__ import annotations

import json

import pytest

from loraplex.platform.tokenizing.tool_calls import (
    ParsedToolCall,
    parse_tool_calls,
    tool_call_family,
)


def test_family_from_template() -> None:
    assert tool_call_family("{{ '<tool_call>' }}{{ tools }}") == "hermes"
    assert tool_call_family("<|python_tag|>{{ x }}") == "llama3_json"
    assert tool_call_family("{% if m.role == 'ipython' %}") == "llama3_json"
    assert tool_call_family("<tool_call>\n<function={{ name }}>") == "qwen3_xml"
    assert tool_call_family("{{ messages }}") is None


def test_hermes_and_qwen25() -> None:
    text = ('I will call two.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "get", "arguments": "{\\"k\\": \\"v\\"}"}</tool_call>')  # fmt: skip
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "I will call two."
    assert calls == [ParsedToolCall("add", '{"a": 1}'), ParsedToolCall("get", '{"k": "v"}')]


def test_llama3_json() -> None:
    content, calls = parse_tool_calls(
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "b", "parameters": {}}',
        "llama3_json",
    )
    assert content is None
    assert [c.name for c in calls] == ["add", "b"]
    assert json.loads(calls[0].arguments) == {"a": 1}


def test_qwen3_xml() -> None:
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")  # fmt: skip
    content, calls = parse_tool_calls(text, "qwen3_xml")
    assert content is None
    assert calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris", "days": 3}


@pytest.mark.parametrize("family", ["hermes", "llama3_json", "qwen3_xml"])
def test_text_without_a_well_formed_call_is_content(family: str) -> None:
    for text in ("just words", "<tool_call>{not json}</tool_call>", '{"no_name": 1}'):
        content, calls = parse_tool_calls(text, family)
        assert calls == [] and content == text
    with pytest.raises(ValueError):
        parse_tool_calls("x", "mistral")

"""Tool calls read back from a chat choice's output, whole or as OpenAI's stream deltas.

Under a required tool_choice the grammar made the output a JSON list of `{"name",
"arguments"}`; under a named one, the arguments object itself; under `auto` the model wrote
its own format (`tokenizing.tool_calls`). A choice that ends for `length` keeps its text as
content (it holds no complete call)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from loraplex.platform.gateway.openai_structured import ToolPlan
from loraplex.platform.tokenizing.tool_calls import parse_tool_calls


def reads_tool_calls(plan: ToolPlan | None) -> bool:
    """True when the choice's output is read for tool calls."""
    return plan is not None and (plan.constrained or (plan.mode == "auto" and bool(plan.family)))


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def tool_calls_of(plan: ToolPlan, text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI `tool_calls`) of a finished output; no calls when it holds none."""
    if plan.mode == "named":
        return None, [_call(plan.name or "", text)]
    if plan.mode == "required":
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        calls = [_call(i["name"], json.dumps(i["arguments"], ensure_ascii=False)) for i in items]
        return None, calls
    if plan.family is None:
        return text, []
    content, parsed = parse_tool_calls(text, plan.family)
    return content, [_call(c.name, c.arguments) for c in parsed]


def finish_reason(plan: ToolPlan | None, reason: str, calls: list[dict[str, Any]]) -> str:
    """OpenAI's `tool_calls` for a choice that stopped on its own with calls in it."""
    return "tool_calls" if plan is not None and calls and reason == "stop" else reason


_MARKERS = {"hermes": "<tool_call>", "qwen3_xml": "<tool_call>"}
_LLAMA_STARTS = ("{", "<|python_tag|>")


def streamable(text: str, family: str | None) -> int:
    """How much of an `auto` choice's text so far cannot be part of a tool call (so streams as
    content now): up to a call's opening marker, or a partial marker at the end; for Llama's
    JSON calls (the whole reply) nothing while the reply may still start one."""
    if family in _MARKERS:
        marker = _MARKERS[family]
        at = text.find(marker)
        if at >= 0:
            return at
        keep = next((k for k in range(min(len(marker) - 1, len(text)), 0, -1)
                     if marker.startswith(text[-k:])), 0)  # fmt: skip
        return len(text) - keep
    head = text.lstrip()
    if not head or any(s.startswith(head[: len(s)]) for s in _LLAMA_STARTS):
        return 0
    return len(text)


class ToolStream:
    """One streamed choice read for tool calls: a named call streams its arguments as they
    come; under `auto` text streams as content until a call may begin; a required list is
    held until the choice ends, then sent as call deltas."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of `text` already sent as content (auto)
        self._named_id: str | None = None

    def deltas(self, text: str) -> list[dict[str, Any]]:
        """Deltas for new output text (empty while held back)."""
        self.text += text
        if self.plan.mode == "auto":
            upto = max(self.sent, streamable(self.text, self.plan.family))
            new, self.sent = self.text[self.sent : upto], upto
            return [{"content": new}] if new else []
        if self.plan.mode != "named" or not text:
            return []
        if self._named_id is None:
            call = _call(self.plan.name or "", text)
            self._named_id = call["id"]
            return [{"tool_calls": [{"index": 0, **call}]}]
        return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}]

    def finish(self, reason: str) -> tuple[list[dict[str, Any]], str]:
        """The held-back deltas and the choice's finish reason, once it ended for `reason`."""
        if self.plan.mode == "named":
            if self._named_id is None and reason == "stop":  # an empty output: still one call
                return [{"tool_calls": [{"index": 0, **_call(self.plan.name or "", "")}]}], \
                    "tool_calls"  # fmt: skip
            return [], "tool_calls" if reason == "stop" else reason
        rest = self.text[self.sent :]
        if reason != "stop":
            return ([{"content": rest}] if rest else []), reason
        content, calls = tool_calls_of(self.plan, rest)
        out: list[dict[str, Any]] = [{"content": content}] if content else []
        for i, call in enumerate(calls):
            fn = call["function"]
            head = {"index": i, "id": call["id"], "type": "function",
                    "function": {"name": fn["name"], "arguments": ""}}  # fmt: skip
            out.append({"tool_calls": [head]})
            out.append({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]})
        return out, finish_reason(self.plan, reason, calls)

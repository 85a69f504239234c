"""The request fields that constrain output: OpenAI's `response_format`, `tools`,
`tool_choice`, `parallel_tool_calls`, and vLLM's `guided_json` / `guided_regex` /
`guided_choice` / `guided_grammar` / `structured_outputs`, validated here and turned into the
wire's `StructuredOutput` (the replica compiles it) plus a `ToolPlan` saying how the gateway
reads the output back (free text, tool calls parsed from the model's own format, or tool
calls the grammar guarantees)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from loraplex.platform.errors import HttpError
from loraplex.platform.tokenizing.tool_calls import tool_call_family
from loraplex.platform.wire import StructuredOutput
from loraplex.platform.wire.grammar import grammar_error

MAX_TOOLS = 128
MAX_SCHEMA_CHARS = 256 * 1024
_NAME = r"^[A-Za-z0-9_\-.]{1,64}$"
MAX_JSON_DEPTH = 32  # of a schema a client sends (the body's own parser stops at about 200)


def json_depth(value: Any, limit: int) -> int:
    """How deep `value` nests (counting stops once past `limit`), without recursion."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest


def _shallow(value: Any) -> Any:
    if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_shallow)]
"""A JSON object a client sends as data (a schema): any keys, nested at most MAX_JSON_DEPTH."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JsonSchemaFormat(_Strict):
    """`response_format.json_schema`: a named schema (`strict` is always honoured)."""

    name: str = Field(pattern=_NAME)
    description: str | None = None
    schema_: JsonObject = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """`response_format`: text, any JSON object, or a JSON schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required exactly when type is 'json_schema'")
        return self


class FunctionDef(_Strict):
    """A tool's function: name, description, JSON-schema parameters."""

    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class Tool(_Strict):
    """One entry of `tools` (only function tools exist in chat completions)."""

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    """`{"name": ...}` inside a named `tool_choice`."""

    name: str = Field(pattern=_NAME)


class NamedToolChoice(_Strict):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    type: Literal["function"]
    function: NamedFunction


class StructuredOutputsField(_Strict):
    """vLLM's `structured_outputs`: exactly one of its constraints."""

    json_: JsonObject | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, min_length=1, max_length=MAX_SCHEMA_CHARS)
    choice: list[str] | None = None
    grammar: str | None = Field(default=None, min_length=1, max_length=MAX_SCHEMA_CHARS)
    json_object: bool | None = None


class FunctionCallIn(_Strict):
    """A function call in an assistant message of the history."""

    name: str = Field(max_length=256)
    arguments: str = Field(max_length=MAX_SCHEMA_CHARS)


class ToolCallIn(_Strict):
    """One of an assistant message's `tool_calls` in the history."""

    id: str = Field(max_length=256)
    type: Literal["function"]
    function: FunctionCallIn

    def template_dict(self) -> dict[str, Any]:
        """As HF chat templates expect it (arguments parsed to a mapping when they are JSON)."""
        try:
            args: Any = json.loads(self.function.arguments)
        except json.JSONDecodeError:
            args = self.function.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": args}}  # fmt: skip


class ConstraintFields(BaseModel):
    """The constraining fields, shared by chat and completions (tools are chat's only)."""

    model_config = ConfigDict(extra="ignore")

    response_format: ResponseFormat | None = None
    guided_json: JsonObject | str | None = None
    guided_regex: str | None = Field(default=None, min_length=1, max_length=MAX_SCHEMA_CHARS)
    guided_choice: list[str] | None = Field(default=None, max_length=1024)
    guided_grammar: str | None = Field(default=None, min_length=1, max_length=MAX_SCHEMA_CHARS)
    structured_outputs: StructuredOutputsField | None = None


@dataclass
class ToolPlan:
    """How a chat request uses tools: `mode` none | auto | required | named (`name`)."""

    mode: str
    tools: list[Tool] = field(default_factory=list)
    name: str | None = None
    parallel: bool = True
    family: str | None = None  # the model's own tool-call format, parsed under `auto`

    @property
    def constrained(self) -> bool:
        """True when the grammar guarantees tool calls (required or a named function)."""
        return self.mode in ("required", "named")

    def template_tools(self) -> list[dict[str, Any]] | None:
        """`tools` as HF chat templates take them (None when there are none)."""
        return [t.model_dump(exclude_none=True) for t in self.tools] or None


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError:
            raise HttpError(400, f"`{param}` is not valid JSON.", param=param,
                            code="invalid_value") from None  # fmt: skip
    if not isinstance(schema, (dict, bool)):
        raise HttpError(400, f"`{param}` must be a JSON schema object.", param=param,
                        code="invalid_value")  # fmt: skip
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_SCHEMA_CHARS:
        raise HttpError(400, f"`{param}` is larger than {MAX_SCHEMA_CHARS} characters.",
                        param=param, code="invalid_value")  # fmt: skip
    return text


def output_constraint(body: ConstraintFields) -> tuple[str, StructuredOutput] | None:
    """(field, wire constraint) of the request's response_format / guided_* fields (at most
    one may be given)."""
    found: list[tuple[str, StructuredOutput]] = []
    rf = body.response_format
    if rf is not None and rf.type == "json_object":
        found.append(("response_format", StructuredOutput(kind="json_object")))
    if rf is not None and rf.json_schema is not None:
        text = _schema_text(rf.json_schema.schema_, "response_format")
        found.append(("response_format", StructuredOutput(kind="json_schema", value=text)))
    if body.guided_json is not None:
        text = _schema_text(body.guided_json, "guided_json")
        found.append(("guided_json", StructuredOutput(kind="json_schema", value=text)))
    if body.guided_regex is not None:
        found.append(("guided_regex", StructuredOutput(kind="regex", value=body.guided_regex)))
    if body.guided_choice is not None:
        found.append(("guided_choice", _choice(body.guided_choice, "guided_choice")))
    if body.guided_grammar is not None:
        found.append(
            ("guided_grammar", StructuredOutput(kind="grammar", value=body.guided_grammar))
        )
    so = body.structured_outputs
    if so is not None:
        found += [("structured_outputs", c) for c in _structured_outputs(so)]
    if len(found) > 1:
        names = ", ".join(sorted({n for n, _ in found}))
        raise HttpError(400, f"Only one output constraint may be given; got {names}.",
                        param=found[1][0], code="invalid_value")  # fmt: skip
    return found[0] if found else None


def _choice(choices: list[str], param: str) -> StructuredOutput:
    if not choices or any(not isinstance(c, str) or not c for c in choices):
        raise HttpError(400, f"`{param}` must be a non-empty list of non-empty strings.",
                        param=param, code="invalid_value")  # fmt: skip
    return StructuredOutput(kind="choice", choices=choices)


def _structured_outputs(so: StructuredOutputsField) -> list[StructuredOutput]:
    out = []
    if so.json_ is not None:
        out.append(StructuredOutput(kind="json_schema",
                                    value=_schema_text(so.json_, "structured_outputs")))  # fmt: skip
    if so.regex is not None:
        out.append(StructuredOutput(kind="regex", value=so.regex))
    if so.choice is not None:
        out.append(_choice(so.choice, "structured_outputs"))
    if so.grammar is not None:
        out.append(StructuredOutput(kind="grammar", value=so.grammar))
    if so.json_object:
        out.append(StructuredOutput(kind="json_object"))
    if not out:
        raise HttpError(400, "`structured_outputs` names no constraint.",
                        param="structured_outputs", code="invalid_value")  # fmt: skip
    return out


def tool_call_schema(plan: ToolPlan) -> dict[str, Any]:
    """The JSON schema the output must match when tool calls are required: a list of
    `{"name", "arguments"}` (one item unless parallel calls are allowed), or for a named
    function its arguments alone."""

    def params(t: Tool) -> dict[str, Any]:
        return t.function.parameters or {"type": "object", "properties": {}}

    if plan.mode == "named":
        return params(next(t for t in plan.tools if t.function.name == plan.name))
    calls = [
        {"type": "object",
         "properties": {"name": {"const": t.function.name}, "arguments": params(t)},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in plan.tools
    ]  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not plan.parallel:
        schema["maxItems"] = 1
    return schema


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def tool_plan(
    tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool | None
) -> ToolPlan:
    """Check `tools` / `tool_choice` / `parallel_tool_calls` together (400 on a contradiction)."""
    tools = tools or []
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise HttpError(400, "Tool function names must be unique.", param="tools",
                        code="invalid_value")  # fmt: skip
    if choice is None:
        choice = "auto" if tools else "none"
    plan = ToolPlan("none", tools, parallel=True if parallel is None else parallel)
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise HttpError(400, f"tool_choice names function {choice.function.name!r}, which is "
                            "not in `tools`.", param="tool_choice", code="invalid_value")  # fmt: skip
        plan.mode, plan.name = "named", choice.function.name
    else:
        plan.mode = choice
    strict = [t.function.name for t in tools if t.function.strict]
    if plan.mode == "auto" and strict:
        raise HttpError(400, f"Function {strict[0]!r} is strict, which is guaranteed only under "
                        'tool_choice "required" or a named function (under "auto" the model '
                        "writes its own format).", param="tools", code="unsupported_parameter")  # fmt: skip
    if plan.mode in ("auto", "required") and not tools:
        raise HttpError(400, f"tool_choice {plan.mode!r} needs `tools`.", param="tool_choice",
                        code="invalid_value")  # fmt: skip
    return plan


@dataclass
class Constraints:
    """What a request's constraining fields become: the wire constraint and logit bias the
    replica applies, and the tool plan the gateway reads the output back with."""

    structured: StructuredOutput | None = None
    logit_bias: dict[int, float] | None = None
    tools: ToolPlan | None = None

    def sampling_fields(self) -> dict[str, Any]:
        """The `SamplingOptions` fields they set."""
        return {"structured": self.structured, "logit_bias": self.logit_bias}


def request_constraints(
    body: Any, vocab_size: int, template_source: str | None, tool_call_format: str | None = None
) -> Constraints:
    """Constraints of a parsed chat (`template_source` given) or text completion body;
    `tool_call_format` (the deployment's option) overrides the template's tool-call format."""
    given = output_constraint(body)
    param, structured = given if given is not None else ("", None)
    out = Constraints(structured, body.token_logit_bias())
    bad = [t for t in out.logit_bias or {} if t >= vocab_size]
    if bad:
        raise HttpError(400, f"logit_bias token ids must be in [0, {vocab_size}); got {bad[0]}.",
                        param="logit_bias", code="invalid_value")  # fmt: skip
    if template_source is not None:
        out.tools = _tools(body, template_source, out, tool_call_format)
        if out.tools.constrained:
            param = "tools"
    if out.structured is not None:
        s = out.structured
        error = grammar_error(s.kind, s.value, s.choices or ())
        if error:
            raise HttpError(400, f"`{param}` cannot be served: {error}", param=param,
                            code="invalid_value")  # fmt: skip
    return out


def _tools(
    body: Any, template_source: str, out: Constraints, tool_call_format: str | None
) -> ToolPlan:
    """The chat request's tool plan; a required or named choice sets the output constraint.
    Under `auto`, calls are read in the deployment's format, else in the template's."""
    plan = tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls)
    if plan.mode == "auto":
        if "tools" not in template_source:
            raise HttpError(400, "This model's chat template does not show `tools` to the model, "
                            'so it cannot choose to call them; use tool_choice "required" or a '
                            "named function (the output is then constrained to the call).",
                            param="tools", code="unsupported_parameter")  # fmt: skip
        plan.family = tool_call_format or tool_call_family(template_source)
    if plan.constrained:
        if out.structured is not None:
            raise HttpError(400, "A required or named tool_choice cannot be combined with "
                            "another output constraint.", param="tool_choice",
                            code="invalid_value")  # fmt: skip
        text = json.dumps(tool_call_schema(plan), ensure_ascii=False, separators=(",", ":"))
        out.structured = StructuredOutput(kind="json_schema", value=text)
    return plan

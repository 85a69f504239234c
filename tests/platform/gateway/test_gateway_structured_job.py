"""Structured outputs and tools in the gateway's job building: the wire constraint of each
request field, tools and tool history rendered by a tool-aware (Hermes-style) chat template,
the tool plan, and tool calls read back whole and as OpenAI stream deltas."""

from __future__ import annotations

import dataclasses
import json
import uuid

import jsonschema
import pytest
from support.gateway_catalog import make_model_dir

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.gateway.deployment_choice import DeploymentRoute
from loraplex.platform.gateway.endpoints import build_chat_job, build_text_job
from loraplex.platform.gateway.openai_schemas import parse_chat_request, parse_completion_request
from loraplex.platform.gateway.openai_structured import Tool, ToolPlan, tool_call_schema
from loraplex.platform.gateway.resolve import ResolvedModel, with_named_deployment
from loraplex.platform.gateway.tool_outputs import ToolStream, tool_calls_of

# A Hermes/Qwen-style template: tools in the system turn, calls and results in the history.
HERMES = (
    "{% if tools %}<s>system\nTools: {% for t in tools %}{{ t.function.name }}:"
    "{{ t.function.parameters | tojson }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}<s>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}{% endif %}"
    "{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>"
    "{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
TOOL = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}  # fmt: skip
TENANT = uuid.uuid4()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> ModelAssets:
    return ModelAssets.load(make_model_dir(tmp_path_factory.mktemp("m"), HERMES, 4096))


def _resolved() -> ResolvedModel:
    return ResolvedModel("m", uuid.uuid4(), "base", "models/base/", uuid.uuid4(), "dep", False)


def chat_job(assets: ModelAssets, **fields: object):  # noqa: ANN201
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return build_chat_job(parse_chat_request(body), _resolved(), assets, TENANT, None, 16)


def prompt(assets: ModelAssets, job) -> str:  # noqa: ANN001
    return assets.tokenizer.decode(job.prompt_ids, skip_special_tokens=False)


def test_tools_and_tool_history_reach_the_template(assets: ModelAssets) -> None:
    history = [
        {"role": "user", "content": "add one"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]  # fmt: skip
    job = chat_job(assets, messages=history, tools=[TOOL])
    text = prompt(assets, job)
    assert 'Tools: add:{"type": "object"' in text
    assert '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' in text
    assert "<tool_response>42</tool_response>" in text
    assert job.tools is not None and job.tools.mode == "auto" and job.tools.family == "hermes"
    assert job.sampling.structured is None  # auto: free output, parsed afterwards


def test_the_deployments_tool_call_format_wins_over_the_template(assets: ModelAssets) -> None:
    """A deployment's `tool_call_format` chooses how `auto` output is read (the template here
    teaches Hermes); without one, the template's format is used."""
    resolved = dataclasses.replace(_resolved(), tool_call_format="llama3_json")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
    job = build_chat_job(parse_chat_request(body), resolved, assets, TENANT, None, 16)
    assert job.tools is not None and job.tools.family == "llama3_json"
    _, calls = tool_calls_of(job.tools, '{"name": "add", "parameters": {"a": 2}}')
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("add", {"a": 2})
    ]
    assert chat_job(assets, tools=[TOOL]).tools.family == "hermes"


def test_the_named_deployments_tool_call_format_is_used() -> None:
    """Routed by the X-Loraplex-Deployment header, a request reads tool calls in the format of
    the deployment it named."""
    a = DeploymentRoute("a", uuid.uuid4(), None, True, 1.0, tool_call_format=None)
    b = DeploymentRoute("b", uuid.uuid4(), None, True, 1.0, tool_call_format="qwen3_xml")
    resolved = dataclasses.replace(_resolved(), deployment_routes=(a, b))
    assert with_named_deployment(resolved, "b").tool_call_format == "qwen3_xml"
    assert with_named_deployment(resolved, "a").tool_call_format is None


def test_each_field_becomes_one_wire_constraint(assets: ModelAssets) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    cases = [
        ({"response_format": fmt}, "json_schema"),
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"response_format": {"type": "text"}}, None),
        ({"guided_json": json.dumps(schema)}, "json_schema"),
        ({"guided_regex": "a+"}, "regex"),
        ({"guided_choice": ["a", "b"]}, "choice"),
        ({"guided_grammar": 'start: "a"'}, "grammar"),
        ({"structured_outputs": {"choice": ["x"]}}, "choice"),
        ({"tools": [TOOL], "tool_choice": "required"}, "json_schema"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "add"}}},
         "json_schema"),
    ]  # fmt: skip
    for fields, kind in cases:
        s = chat_job(assets, **fields).sampling.structured
        assert (s.kind if s else None) == kind, fields
    text = build_text_job(parse_completion_request({"model": "m", "prompt": "p",
                                                    "guided_regex": "[0-9]+"}),
                          _resolved(), assets, TENANT, None, 16)  # fmt: skip
    assert text.sampling.structured.kind == "regex"
    job = chat_job(assets, logit_bias={"5": -100, "7": 2.5})
    assert job.sampling.logit_bias == {5: -100.0, 7: 2.5}


def test_contradictions_are_400(assets: ModelAssets) -> None:
    for fields in (
        {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
        {"tools": [TOOL, TOOL]},
        {"tool_choice": "auto"},
        {"guided_regex": "a", "guided_json": {}},
        {"structured_outputs": {}},
        {"logit_bias": {"x": 1}},
        {"logit_bias": {"1": 101}},
        {"guided_grammar": "root ::= ("},
        # found by the API fuzz test: an empty constraint reached the wire model (a 500)
        {"guided_regex": ""},
        {"guided_grammar": ""},
        {"structured_outputs": {"regex": ""}},
        # strict arguments are guaranteed only where the output is constrained
        {"tools": [{**TOOL, "function": {**TOOL["function"], "strict": True}}]},
    ):
        with pytest.raises(HttpError) as info:
            chat_job(assets, **fields)
        assert info.value.status == 400, fields


def test_strict_tools_are_served_where_constrained(assets: ModelAssets) -> None:
    strict = {**TOOL, "function": {**TOOL["function"], "strict": True}}
    job = chat_job(assets, tools=[strict], tool_choice="required")
    assert job.sampling.structured is not None


def test_required_schema_and_parse_back() -> None:
    tools = [Tool.model_validate(TOOL), Tool.model_validate(
        {"type": "function", "function": {"name": "noop"}})]  # fmt: skip
    plan = ToolPlan("required", tools, parallel=False)
    schema = tool_call_schema(plan)
    out = '[{"name":"add","arguments":{"a":3}}]'
    jsonschema.validate(json.loads(out), schema)
    with pytest.raises(jsonschema.ValidationError):  # one call only without parallel calls
        jsonschema.validate(json.loads(out[:-1] + ',{"name":"noop","arguments":{}}]'), schema)
    content, calls = tool_calls_of(plan, out)
    assert content is None and calls[0]["function"] == {"name": "add", "arguments": '{"a": 3}'}


def test_tool_stream_deltas() -> None:
    named = ToolStream(ToolPlan("named", [Tool.model_validate(TOOL)], name="add"))
    first = named.deltas('{"a"')
    assert first[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a"'}
    assert named.deltas(":1}") == [{"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}]
    assert named.finish("stop") == ([], "tool_calls")

    auto = ToolStream(ToolPlan("auto", [Tool.model_validate(TOOL)], family="hermes"))
    assert auto.deltas("ok <tool") == [{"content": "ok "}]  # a partial marker is held back
    assert auto.deltas('_call>{"name": "add", ') == []
    assert auto.deltas('"arguments": {"a": 2}}</tool_call>') == []
    deltas, reason = auto.finish("stop")
    assert reason == "tool_calls"
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": ""}
    assert deltas[1]["tool_calls"][0]["function"] == {"arguments": '{"a": 2}'}
    plain = ToolStream(ToolPlan("auto", [Tool.model_validate(TOOL)], family="hermes"))
    assert plain.deltas("no calls <to") == [{"content": "no calls "}]
    assert plain.deltas("x") == [{"content": "<tox"}]  # no longer a marker: sent
    assert plain.finish("length") == ([], "length")
    llama = ToolStream(ToolPlan("auto", [Tool.model_validate(TOOL)], family="llama3_json"))
    assert llama.deltas(' {"name": "add", "parameters": {"a": 5}}') == []
    deltas, reason = llama.finish("stop")
    assert reason == "tool_calls" and len(deltas) == 2
    words = ToolStream(ToolPlan("auto", [Tool.model_validate(TOOL)], family="llama3_json"))
    assert words.deltas("Hello") == [{"content": "Hello"}]
    assert words.finish("stop") == ([], "stop")


def test_tools_under_auto_need_a_template_that_shows_them(tmp_path) -> None:  # noqa: ANN001
    """A template that never renders `tools` would drop them silently under `auto` (the model
    could not know them): refused by name; required and named calls are still served (the
    grammar guarantees them)."""
    plain = ModelAssets.load(make_model_dir(tmp_path, None, 4096))
    with pytest.raises(HttpError) as info:
        chat_job(plain, tools=[TOOL])
    assert info.value.code == "unsupported_parameter" and info.value.param == "tools"
    assert chat_job(plain, tools=[TOOL], tool_choice="required").sampling.structured is not None
    assert chat_job(plain, tools=[TOOL], tool_choice="none").tools.mode == "none"

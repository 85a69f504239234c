"""Structured outputs and tool calling through the real gateway and a real replica of the
random-weight demo model (its free text is noise: valid output can only come from the
grammar), driven by the official `openai` SDK: `parse()` with a Pydantic model, JSON schemas,
vLLM's guided_* fields, required / named tool calls streamed and not (assembled by the SDK's
stream helper), `max_tokens` mid-JSON, and every unserved request field refused by name."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from support import openai_stack
from support.openai_stack import Stack

from loraplex.bench._synthetic.json_schemas import json_schemas

pytestmark = pytest.mark.timeout(300)
stack = openai_stack.stack

MESSAGES = [{"role": "user", "content": "Describe a person."}]


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=10)


def _tool(name: str, props: dict) -> dict:
    params = {"type": "object", "properties": props, "required": list(props),
              "additionalProperties": False}  # fmt: skip
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": params}}  # fmt: skip


TOOLS = [
    _tool("get_weather", {"city": {"type": "string", "maxLength": 10},
                          "unit": {"enum": ["c", "f"]}}),
    _tool("add", {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                  "b": {"type": "integer", "minimum": 0, "maximum": 99}}),
    _tool("search", {"query": {"type": "string", "maxLength": 12},
                     "limit": {"type": "integer", "minimum": 1, "maximum": 5}}),
]  # fmt: skip
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def test_parse_returns_the_pydantic_object(stack: Stack) -> None:
    client = stack.client()
    resp = client.chat.completions.parse(
        model=stack.base, messages=MESSAGES, response_format=Person, max_tokens=200,
        temperature=0.8, seed=1,
    )  # fmt: skip
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)


def test_json_schemas_through_the_gateway_all_valid(stack: Stack) -> None:
    """Every fifth of the fifty schemas, at once (one engine batch), chat and completions."""
    client = stack.client()
    schemas = json_schemas()[::5]

    def chat(i: int) -> tuple[dict, str, str]:
        schema = schemas[i]
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}
        r = client.chat.completions.create(model=stack.base, messages=MESSAGES,
                                           response_format=fmt, max_tokens=300, seed=i)  # fmt: skip
        return schema, r.choices[0].message.content, r.choices[0].finish_reason

    def text(i: int) -> tuple[dict, str, str]:
        schema = schemas[i]
        r = client.completions.create(model=stack.base, prompt="json:", max_tokens=300,
                                      seed=i, extra_body={"guided_json": schema})  # fmt: skip
        return schema, r.choices[0].text, r.choices[0].finish_reason

    with ThreadPoolExecutor(len(schemas)) as pool:
        results = list(pool.map(lambda i: (chat if i % 2 else text)(i), range(len(schemas))))
    for schema, out, finish in results:
        assert finish == "stop", out
        jsonschema.validate(json.loads(out), schema)


def test_vllm_guided_fields(stack: Stack) -> None:
    client = stack.client()
    cases = [
        ({"guided_regex": "[0-9]{3}-[a-z]{3}"}, r"[0-9]{3}-[a-z]{3}"),
        ({"guided_choice": ["alpha", "beta"]}, r"alpha|beta"),
        ({"guided_grammar": 'root ::= "x" [0-9] [0-9]'}, r"x[0-9]{2}"),
        ({"structured_outputs": {"regex": "(yes|no)!"}}, r"(yes|no)!"),
    ]
    import re

    for extra, pattern in cases:
        r = client.chat.completions.create(model=stack.base, messages=MESSAGES, max_tokens=30,
                                           extra_body=extra)  # fmt: skip
        assert re.fullmatch(pattern, r.choices[0].message.content), (extra, r)


def test_json_object_and_length_mid_json(stack: Stack) -> None:
    client = stack.client()

    # Any object: its strings are unbounded, so this noise model may not close one within
    # max_tokens; those that stopped are objects (and several seeds do stop).
    def obj(seed: int) -> tuple[str, str]:
        r = client.chat.completions.create(model=stack.base, messages=MESSAGES, max_tokens=200,
                                           response_format={"type": "json_object"}, seed=seed)  # fmt: skip
        return r.choices[0].message.content, r.choices[0].finish_reason

    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(obj, range(6)))
    stopped = [text for text, finish in outs if finish == "stop"]
    assert stopped
    assert all(isinstance(json.loads(text), dict) for text in stopped)
    fmt = {"type": "json_schema", "json_schema": {"name": "p",
                                                  "schema": Person.model_json_schema()}}  # fmt: skip
    r = client.chat.completions.create(model=stack.base, messages=MESSAGES, max_tokens=3,
                                       response_format=fmt)  # fmt: skip
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def _check_calls(calls: list, allowed: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_required_tool_calls_not_streamed(stack: Stack) -> None:
    client = stack.client()
    for seed in range(3):
        r = client.chat.completions.create(model=stack.base, messages=MESSAGES, tools=TOOLS,
                                           tool_choice="required", max_tokens=300, seed=seed)  # fmt: skip
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        _check_calls(choice.message.tool_calls, set(PARAMS))
    r = client.chat.completions.create(model=stack.base, messages=MESSAGES, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=300, seed=9)  # fmt: skip
    assert len(r.choices[0].message.tool_calls) == 1


def test_required_tool_calls_streamed_assemble(stack: Stack) -> None:
    client = stack.client()
    with client.chat.completions.stream(model=stack.base, messages=MESSAGES, tools=TOOLS,
                                        tool_choice="required", max_tokens=300, seed=5) as s:  # fmt: skip
        events = list(s)
        final = s.get_final_completion()
    assert any(e.type == "tool_calls.function.arguments.done" for e in events)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls, set(PARAMS))


def test_named_tool_streams_its_arguments(stack: Stack) -> None:
    client = stack.client()
    choice = {"type": "function", "function": {"name": "add"}}
    chunks = list(client.chat.completions.create(
        model=stack.base, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
        max_tokens=100, stream=True, seed=2))  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) > 1  # the name first, then the arguments as they come
    assert deltas[0].tool_calls[0].function.name == "add"
    args = "".join(d.tool_calls[0].function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), PARAMS["add"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_logit_bias_is_served(stack: Stack) -> None:
    tok = stack.assets.tokenizer
    target = tok.encode(" apples", add_special_tokens=False)[0]
    r = stack.client().chat.completions.create(
        model=stack.base, messages=MESSAGES, max_tokens=4, temperature=0,
        logit_bias={str(target): 100})  # fmt: skip
    assert r.choices[0].message.content == tok.decode([target] * 4)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("audio", {"voice": "alloy", "format": "mp3"}),
        ("functions", [{"name": "f", "parameters": {}}]),
        ("function_call", "auto"),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("reasoning_effort", "low"),
        ("service_tier", "flex"),
        ("store", True),
        ("metadata", {"a": "b"}),
        ("web_search_options", {}),
        ("top_k", 5),
        ("no_such_field", 1),
    ],
)
def test_unserved_fields_are_refused_by_name(stack: Stack, field: str, value: object) -> None:
    body = {"model": stack.base, "messages": MESSAGES, "max_tokens": 2, field: value}
    resp = httpx.post(f"{stack.api.url}/v1/chat/completions", json=body,
                      headers={"authorization": f"Bearer {stack.key_a}"}, timeout=30)  # fmt: skip
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "unsupported_parameter" and err["param"] == field
    assert field in err["message"]


def test_bad_constraints_are_400(stack: Stack) -> None:
    client = stack.client()
    bad = [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            }
        },
        {"extra_body": {"guided_regex": "(unclosed"}},
        {"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tool_choice": "required"},
        {"logit_bias": {"99999999": 1}},
    ]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=stack.base, messages=MESSAGES, max_tokens=2, **kw)
        assert info.value.status_code == 400


@pytest.fixture(scope="module")
def adapter(stack: Stack) -> str:
    """One tenant adapter, uploaded through the API and validated by a real worker."""
    from support.gateway_stack import settings_env
    from support.peft_adapters import make_peft_adapter
    from support.uploads import upload_adapter

    from loraplex.platform.local_processes import start_worker_process

    proc = start_worker_process(settings_env(stack.settings, "worker"), stack.work / "worker.log")
    try:
        folder = make_peft_adapter(stack.model_dir, stack.work / "json-lora", seed=7)
        upload_adapter(stack, stack.key_a, "json-lora", folder)
    finally:
        proc.stop()
    return str(folder)


@pytest.mark.gateway_adapters
def test_adapter_and_base_constrained_in_one_batch(stack: Stack, adapter: str) -> None:
    """Constrained requests on the tenant's adapter and on the base, sent together (one engine
    batch), streamed and not: all valid, and the adapter's equal the offline engine's with the
    same adapter and constraint."""
    from support.openai_stack import chat_prompt_ids

    from loraplex.platform.engine.llm import LLM
    from loraplex.platform.engine.sampling_params import SamplingParams
    from loraplex.platform.engine.structured import GrammarSpec

    client = stack.client()
    schema = json_schemas()[1]  # integers and bounded strings: greedy decoding ends
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}

    def call(args: tuple[str, bool]) -> tuple[str, str]:
        model, stream = args
        kw = dict(model=model, messages=MESSAGES, response_format=fmt, max_tokens=200,
                  temperature=0)  # fmt: skip
        if not stream:
            r = client.chat.completions.create(**kw)
            return r.choices[0].message.content, r.choices[0].finish_reason
        chunks = list(client.chat.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].choices[0].finish_reason

    jobs = [("json-lora", False), (stack.base, False), ("json-lora", True), (stack.base, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(call, jobs))
    for text, finish in outs:
        assert finish == "stop"
        jsonschema.validate(json.loads(text), schema)
    assert outs[0][0] == outs[2][0] and outs[1][0] == outs[3][0]
    assert outs[0][0] != outs[1][0]  # the adapter is applied
    offline = LLM(str(stack.model_dir), max_loras=2, max_lora_rank=16)
    spec = GrammarSpec("json_schema", json.dumps(schema, separators=(",", ":")))
    ids = chat_prompt_ids(stack, MESSAGES)
    ref = offline.generate([ids], SamplingParams(temperature=0, max_tokens=200, structured=spec),
                           adapters=[adapter])[0]  # fmt: skip
    assert outs[0][0] == ref.outputs[0].text

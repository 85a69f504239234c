"""Request validation: bad parameters become 400s in the OpenAI error shape, never 500s."""

from __future__ import annotations

import pytest

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway import openai_schemas as oa

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _err(fn, body) -> HttpError:
    with pytest.raises(HttpError) as info:
        fn(body)
    exc = info.value
    assert exc.status == 400
    body = exc.body()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    return exc


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"n": 100}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -3}, "max_completion_tokens"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"seed": "abc"}, "seed"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": ""}, "model"),
        ({"stream_options": {"include_usage": True}}, None),
    ],
)
def test_chat_out_of_range_is_400(patch: dict, param: str | None) -> None:
    exc = _err(oa.parse_chat_request, {**CHAT, **patch})
    assert exc.param == param
    if param:
        assert param.split("[")[0] in exc.message


def test_top_logprobs_needs_logprobs() -> None:
    exc = _err(oa.parse_chat_request, {**CHAT, "top_logprobs": 3})
    assert "logprobs" in exc.message


def test_missing_model_and_non_object_body() -> None:
    exc = _err(oa.parse_chat_request, {"messages": CHAT["messages"]})
    assert exc.code == "missing_required_parameter" and exc.param == "model"
    exc = _err(oa.parse_chat_request, ["not", "an", "object"])
    assert exc.code == "invalid_json"


def test_valid_chat_parses_all_parameters() -> None:
    req = oa.parse_chat_request(
        {
            **CHAT,
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "n": 2,
            "stop": "END",
            "seed": -5,
            "presence_penalty": 1,
            "frequency_penalty": -1,
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u1",
        }
    )
    assert req.requested_max_tokens() == 7
    assert req.stops() == ["END"]
    assert req.include_usage
    assert req.messages[1].text() == "ab"


def test_completion_validation() -> None:
    base = {"model": "m", "prompt": "hello"}
    assert oa.parse_completion_request(base).requested_max_tokens() == 16
    assert oa.parse_completion_request({**base, "prompt": [1, 2, 3]}).prompt_text_or_ids() == [
        1,
        2,
        3,
    ]
    assert oa.parse_completion_request({**base, "prompt": ["x"]}).prompt_text_or_ids() == "x"
    assert _err(oa.parse_completion_request, {**base, "logprobs": 6}).param == "logprobs"
    _err(oa.parse_completion_request, {**base, "prompt": ["a", "b"]})
    _err(oa.parse_completion_request, {**base, "prompt": []})
    _err(oa.parse_completion_request, {**base, "echo": True})
    assert _err(oa.parse_completion_request, {"model": "m"}).param == "prompt"


def test_builders_match_openai_shapes() -> None:
    usage = oa.usage_dict(3, 4, 1)
    assert usage == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 1},
    }
    full = oa.chat_completion(
        "chatcmpl-1", 1, "m", [{"index": 0, "text": "hi", "finish_reason": "stop"}], usage
    )
    assert full["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert full["choices"][0]["logprobs"] is None
    chunk = oa.chat_chunk("c", 1, "m", 0, {"content": "x"}, with_usage_field=True)
    assert chunk["usage"] is None and chunk["object"] == "chat.completion.chunk"
    final = oa.usage_chunk("c", 1, "m", "chat.completion.chunk", usage)
    assert final["choices"] == [] and final["usage"]["total_tokens"] == 7

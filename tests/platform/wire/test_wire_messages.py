"""The wire format is strict and owns no second copy: sampling field names are the engine's
`SamplingParams` fields (defaults stay there), unknown fields and coerced types are refused,
and events encode and decode to themselves."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import ValidationError

from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.wire_mapping import sampling_params
from loraplex.platform.wire import (
    AdapterRef,
    DeltaEvent,
    ErrorEvent,
    ErrorInfo,
    FinishEvent,
    GenerateRequest,
    SamplingOptions,
    TokenLogprobs,
    TopLogprob,
    Usage,
    decode_event,
    encode_event,
)


def test_sampling_fields_are_the_engines_and_defaults_stay_there() -> None:
    engine = {f.name for f in dataclasses.fields(SamplingParams)}
    assert set(SamplingOptions.model_fields) == engine - {"n"}  # the replica takes n = 1
    assert sampling_params(SamplingOptions()) == SamplingParams()
    got = sampling_params(SamplingOptions(temperature=0.0, stop=["END"], max_tokens=7))
    assert (got.temperature, got.stop, got.max_tokens, got.top_p) == (0.0, ["END"], 7, 1.0)
    with pytest.raises(ValueError, match="top_p"):
        sampling_params(SamplingOptions(top_p=1.5))  # ranges: checked by the engine, once


def _request(**extra: object) -> str:
    doc = {"request_id": "r-1", "prompt_token_ids": [1, 2, 3], "sampling": {"max_tokens": 4}}
    doc.update(extra)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "extra",
    [
        {"stream": True},  # unknown field
        {"max_tokens": 4},  # sampling at top level (the old layout)
        {"sampling": {"max_tokens": "4"}},  # no coercion
        {"sampling": {"n": 2}},
        {"prompt_token_ids": []},
        {"prompt_token_ids": [-1]},
        {"request_id": "has space"},
        {"adapter": {"object_prefix": "p/", "sha256": "xyz"}},
        {"adapter": {"object_prefix": "p/", "sha256": "ab" * 32, "path": "/etc"}},
    ],
)
def test_generate_request_is_strict(extra: dict) -> None:
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate_json(_request(**extra))


def test_generate_request_round_trips() -> None:
    req = GenerateRequest(
        request_id="chatcmpl-1-0",
        prompt_token_ids=[5, 6],
        sampling=SamplingOptions(temperature=0.5, stop=["\n"], seed=3),
        adapter=AdapterRef(object_prefix="tenants/t/a/v1/", sha256="ab" * 32),
        cache_salt="00ff",
    )
    assert GenerateRequest.model_validate_json(req.model_dump_json()) == req


def test_events_round_trip_and_are_strict() -> None:
    top = [TopLogprob(token_id=7, token=" a", logprob=-0.1)]
    events = [
        DeltaEvent(
            token_ids=[7],
            text=" a",
            logprobs=[TokenLogprobs(token_id=7, token=" a", logprob=-0.1, top=top)],
        ),
        FinishEvent(
            finish_reason="length",
            usage=Usage(prompt_tokens=3, completion_tokens=1, cached_tokens=0),
        ),
        ErrorEvent(error=ErrorInfo(message="boom", type="server_error", code="engine_error")),
    ]
    for event in events:
        frame = encode_event(event)
        assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
        assert decode_event(frame[6:-2]) == event
    for bad in (
        '{"type": "delta", "token_ids": [1], "text": "", "finished": false}',
        '{"type": "delta", "new_token_ids": [1], "text": ""}',
        '{"type": "tokens", "token_ids": [1], "text": ""}',
        '{"type": "finish", "finish_reason": "eos", '
        '"usage": {"prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0}}',
    ):
        with pytest.raises(ValidationError):
            decode_event(bad)

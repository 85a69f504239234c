"""A request changes form three times between the route and the engine (issue 28): the body's
bytes become the endpoint's request model (no JSON dict in between), the model becomes the
wire `GenerateRequest` the job carries (the replica gets that object, a copy per choice),
and the replica turns the wire request into the engine's `Request`."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from support.gateway_catalog import make_model_dir

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.gateway.endpoints import CHAT, TEXT
from loraplex.platform.gateway.request_parsing import parse_request
from loraplex.platform.gateway.resolve import ResolvedModel
from loraplex.platform.wire import GenerateRequest, SamplingOptions

TENANT = uuid.uuid4()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> ModelAssets:
    return ModelAssets.load(make_model_dir(tmp_path_factory.mktemp("m"), context_length=64))


def _resolved() -> ResolvedModel:
    return ResolvedModel("m", uuid.uuid4(), "base", "models/base/", uuid.uuid4(), "dep", False)


def _no_dicts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the body went through a JSON dict")

    monkeypatch.setattr(json, "loads", refuse)  # every module's `json.loads` is this one


def test_bytes_become_the_request_model_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_dicts(monkeypatch)
    raw = b'{"model": "m", "prompt": "Hi", "max_tokens": 3, "best_of": 1}'
    body = parse_request(raw, TEXT, None)
    assert body.prompt == "Hi" and body.max_tokens == 3
    chat = b'{"messages": [{"role": "user", "content": "Hi"}]}'
    assert parse_request(chat, CHAT, "my-adapter").model == "my-adapter"


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"[" * 100_000, "invalid_json", None),
        (b"not json", "invalid_json", None),
        (b"[1, 2]", "invalid_json", None),
        (b'{"model": "m", "prompt": "p", "frobnicate": 1}', "unsupported_parameter", "frobnicate"),
        (b'{"model": "m", "prompt": "p", "best_of": 3}', "unsupported_parameter", "best_of"),
        (b'{"prompt": "p"}', "missing_required_parameter", "model"),
        (b'{"model": "", "prompt": "p"}', "invalid_value", "model"),
        (
            b'{"model": "m", "prompt": "p", "response_format": {"type": "json_schema", '
            b'"json_schema": {"name": "x", "schema": ' + b'{"a": ' * 40 + b"1" + b"}" * 43,
            "invalid_value",
            "response_format",
        ),
    ],
)
def test_refusals_from_bytes(
    monkeypatch: pytest.MonkeyPatch, raw: bytes, code: str, param: str | None
) -> None:
    _no_dicts(monkeypatch)
    with pytest.raises(HttpError) as info:
        parse_request(raw, TEXT, None)
    assert (info.value.status, info.value.code, info.value.param) == (400, code, param)


def test_the_job_carries_the_wire_request(assets: ModelAssets) -> None:
    raw = b'{"model": "m", "prompt": [5, 6, 7], "max_tokens": 4, "seed": 9, "n": 2}'
    job = TEXT.build_job(
        parse_request(raw, TEXT, None), _resolved(), assets, TENANT, None, 1024, "m", "salt-1"
    )
    assert isinstance(job.wire, GenerateRequest)
    assert job.wire.prompt_token_ids == [5, 6, 7] and job.wire.cache_salt == "salt-1"
    assert job.wire.sampling.max_tokens == 4 and job.wire.adapter is None
    first, second = job.choice_request(0), job.choice_request(1)
    assert (first.request_id, second.request_id) == (f"{job.cid}-0", f"{job.cid}-1")
    assert (first.sampling.seed, second.sampling.seed) == (9, 10)
    assert first.prompt_token_ids is job.wire.prompt_token_ids  # shared, not copied per choice


def test_the_replica_builds_the_engine_request_from_the_wire_request() -> None:
    from loraplex.platform.engine.engine_loop import PendingAdd

    async def make() -> PendingAdd:
        req = GenerateRequest(request_id="r-0", prompt_token_ids=[1, 2], sampling=SamplingOptions())
        return PendingAdd.of(req)

    add = asyncio.run(make())
    assert add.wire.request_id == "r-0" and add.params.max_tokens is not None

"""Detokenization and stop strings: streamed text equals the one-shot decode, and a stop
sequence split across tokens is never sent."""

from __future__ import annotations

import pytest
from support.gateway_catalog import make_model_dir

from loraplex.platform.gateway.assets import Detokenizer, ModelAssets
from loraplex.platform.gateway.outputs import OutputProcessor
from loraplex.platform.gateway.replica_client import TokenDelta, parse_delta


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> ModelAssets:
    return ModelAssets.load(make_model_dir(tmp_path_factory.mktemp("model")))


TEXT = "Ünïcödé snowman ☃ and emoji 🙂 make bytes span tokens. STOP. Then more"


def test_incremental_decode_equals_full_decode(assets: ModelAssets) -> None:
    ids = assets.encode(TEXT, add_special_tokens=False)
    detok = Detokenizer(assets.tokenizer)
    pieces = [detok.push([t]) for t in ids] + [detok.flush()]
    assert "".join(pieces) == assets.tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def _run(
    assets: ModelAssets, stops: list[str], top: int | None = None
) -> tuple[str, str | None, int]:
    ids = assets.encode(TEXT, add_special_tokens=False)
    proc = OutputProcessor(assets, 0, stops, top)
    streamed, finish = [], None
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        lp = [{t: -0.5, (t + 1) % 300: -1.5}]
        ev = proc.process(TokenDelta([t], logprobs=lp, finish_reason="length" if last else None))
        streamed.append(ev.text)
        if top is not None and ev.num_tokens:
            assert len(ev.logprobs) == 1 and ev.logprobs[0].logprob == -0.5
            assert len(ev.logprobs[0].top) == min(top, 2)
        if ev.finish_reason:
            finish = ev.finish_reason
            break
    return "".join(streamed), finish, proc.num_tokens


def test_stop_string_truncates_and_finishes(assets: ModelAssets) -> None:
    text, finish, _ = _run(assets, ["STOP"], top=1)
    assert text == TEXT[: TEXT.index("STOP")]
    assert finish == "stop"


def test_no_stop_runs_to_length(assets: ModelAssets) -> None:
    text, finish, n = _run(assets, [], top=2)
    assert text == TEXT and finish == "length"
    assert n == len(assets.encode(TEXT, add_special_tokens=False))


def test_text_is_decoded_here_even_when_replica_sends_some(assets: ModelAssets) -> None:
    ids = assets.encode("Hello world", add_special_tokens=False)
    proc = OutputProcessor(assets, 0, [], None)
    ev = proc.process(TokenDelta(ids, text="ignored", finish_reason="stop"))
    assert ev.text == "Hello world" and ev.finish_reason == "stop" and ev.num_tokens == len(ids)


def test_parse_delta_spellings() -> None:
    d = parse_delta(
        {
            "token_ids": [1, 2],
            "logprobs": [{"1": -0.1}, [[2, -0.2]]],
            "finish_reason": None,
            "num_cached_tokens": 16,
        }
    )
    assert (
        d.token_ids == [1, 2] and d.logprobs == [{1: -0.1}, {2: -0.2}] and d.num_cached_tokens == 16
    )
    assert parse_delta({"token_id": 7}).token_ids == [7]
    f = parse_delta({"token_ids": [4], "logprobs": [[{"token_id": 4, "logprob": -0.3}]]})
    assert f.logprobs == [{4: -0.3}]
    e = parse_delta({"new_token_ids": [3], "new_logprobs": [{"3": -1.0}], "finished": True})
    assert e.token_ids == [3] and e.logprobs == [{3: -1.0}]
    assert parse_delta({"error": {"message": "boom"}}).error == "boom"

"""Building a job from a validated request: prompt tokens, context-length checks (400s),
sampling fields sent to the replica, the adapter reference and the tenant cache salt."""

from __future__ import annotations

import uuid

import pytest
from support.gateway_catalog import make_model_dir

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.gateway.completion import SEED_MASK
from loraplex.platform.gateway.endpoints import build_chat_job, build_text_job
from loraplex.platform.gateway.openai_schemas import parse_chat_request, parse_completion_request
from loraplex.platform.gateway.resolve import ResolvedModel
from loraplex.platform.wire import AdapterRef
from loraplex.platform.wire.auth import cache_salt

TENANT = uuid.uuid4()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> ModelAssets:
    return ModelAssets.load(make_model_dir(tmp_path_factory.mktemp("m"), context_length=64))


TARGETS = {"format": 1, "groups": [{"rank": 4, "alpha": 8.0, "scale": 2.0,
                                   "layers": {"q_proj": [0, 1]}}]}  # fmt: skip


def _resolved(adapter: bool = False, share: bool = False) -> ResolvedModel:
    extra = {}
    if adapter:
        extra = dict(
            adapter_id=uuid.uuid4(),
            adapter_name="sql",
            adapter_version_id=uuid.uuid4(),
            adapter_version=3,
            adapter_sha256="ab" * 32,
            adapter_config_sha256="cd" * 32,
            adapter_object_prefix="tenants/t/adapters/a/v3/",
            adapter_targets=TARGETS,
        )
    return ResolvedModel(
        "m", uuid.uuid4(), "base", "models/base/", uuid.uuid4(), "dep", share, **extra
    )


def test_chat_job(assets: ModelAssets) -> None:
    body = parse_chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hello"}],
            "temperature": 0.5,
            "seed": -1,
            "stop": "END",
            "n": 2,
            "logprobs": True,
            "top_logprobs": 3,
            "max_tokens": 5,
        }
    )
    job = build_chat_job(body, _resolved(), assets, TENANT, None, 1024)
    text = assets.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert job.prompt_ids == assets.tokenizer.encode(text, add_special_tokens=False)
    assert job.max_tokens == 5 and job.n == 2 and job.top_n == 3
    s = job.sampling
    assert s.temperature == 0.5 and s.stop == ["END"] and s.logprobs == 3
    assert s.seed == -1 & SEED_MASK and s.seed >= 0
    assert s.top_p is None and s.max_tokens == 5  # left out: the engine's default
    assert job.cid.startswith("chatcmpl-")


def test_default_max_tokens_fills_the_context(assets: ModelAssets) -> None:
    body = parse_completion_request({"model": "m", "prompt": "Hello world", "max_tokens": None})
    body.max_tokens = None
    job = build_text_job(body, _resolved(), assets, TENANT, None, 1024)
    assert job.max_tokens == 16  # completions default
    chat = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    job = build_chat_job(chat, _resolved(), assets, TENANT, None, 1024)
    assert job.max_tokens == 64 - len(job.prompt_ids)


def test_context_length_is_a_400(assets: ModelAssets) -> None:
    long = parse_completion_request({"model": "m", "prompt": "Hello world " * 40})
    with pytest.raises(HttpError) as info:
        build_text_job(long, _resolved(), assets, TENANT, None, 1024)
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"
    over = parse_completion_request({"model": "m", "prompt": "Hi", "max_tokens": 64})
    with pytest.raises(HttpError) as info:
        build_text_job(over, _resolved(), assets, TENANT, None, 1024)
    assert info.value.param == "max_tokens"
    bad_ids = parse_completion_request({"model": "m", "prompt": [1, 2, 10_000]})
    with pytest.raises(HttpError) as info:
        build_text_job(bad_ids, _resolved(), assets, TENANT, None, 1024)
    assert info.value.param == "prompt"


def test_adapter_reference_and_salt() -> None:
    from loraplex.platform.gateway.resolve import adapter_ref

    r = _resolved(adapter=True)
    assert adapter_ref(r, TENANT) == AdapterRef(
        object_prefix="tenants/t/adapters/a/v3/",
        sha256="ab" * 32,
        config_sha256="cd" * 32,
        tenant=str(TENANT),
        targets=TARGETS,
    )
    assert adapter_ref(_resolved(), TENANT) is None
    salt = r.cache_salt(TENANT, "secret-1")
    assert salt == cache_salt("secret-1", str(TENANT)) and str(TENANT) not in salt
    assert salt != r.cache_salt(TENANT, "secret-2") != r.cache_salt(uuid.uuid4(), "secret-1")
    assert _resolved(share=True).cache_salt(TENANT, "secret-1") is None


def test_empty_token_id_prompt_is_a_400(assets: ModelAssets) -> None:
    """Found by the API fuzz test: `"prompt": [[]]` reached the replica and came back a 500."""
    empty = parse_completion_request({"model": "m", "prompt": [[]]})
    with pytest.raises(HttpError) as info:
        build_text_job(empty, _resolved(), assets, TENANT, None, 1024)
    assert info.value.status == 400 and info.value.param == "prompt"


def test_vllm_length_fields_reach_the_replica(assets: ModelAssets) -> None:
    """vLLM's `ignore_eos` and `min_tokens` (as its OpenAI server takes them) are served."""
    body = parse_completion_request(
        {"model": "m", "prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": True, "min_tokens": 4}
    )
    job = build_text_job(body, _resolved(), assets, TENANT, None, 1024)
    assert job.sampling.ignore_eos is True and job.sampling.min_tokens == 4
    left_out = build_text_job(
        parse_completion_request({"model": "m", "prompt": "Hi"}), _resolved(), assets, TENANT,
        None, 1024,
    )  # fmt: skip
    assert left_out.sampling.ignore_eos is None and left_out.sampling.min_tokens is None
    for bad in ({"min_tokens": -1}, {"min_tokens": 9}, {"ignore_eos": "yes"}):
        with pytest.raises(HttpError) as info:
            body = parse_completion_request({"model": "m", "prompt": "Hi", "max_tokens": 8, **bad})
            build_text_job(body, _resolved(), assets, TENANT, None, 1024)  # 9 > max_tokens
        assert info.value.status == 400 and info.value.param in ("min_tokens", "ignore_eos")

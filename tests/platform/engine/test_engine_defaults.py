"""Engine defaults live in EngineConfig (one field, one generated flag) and reach the component.

The CPU KV budget, the adapter admission's starvation bound and the object source's adapter
size limit used to be a module constant and keyword defaults deep in the engine; `LLM` turned multi-LoRA off unless asked while the
engine (and so the server) turned it on by default. Each is now an EngineConfig field with help
text, so `loraplex engine` gets its flag, and the one default serves `LLM` and the server alike.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import engine_core  # noqa: E402
from loraplex.platform.engine.kv_cache import kv_cache_bytes_per_block  # noqa: E402
from loraplex.platform.engine.llm import LLM  # noqa: E402
from loraplex.platform.engine_spec.cli import engine_args, parse_engine_args  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("llama")
    save_tiny_model(path, "llama", with_tokenizer=False)
    return str(path)


def test_the_cli_exposes_the_defaults_and_round_trips_them() -> None:
    config, _ = parse_engine_args(
        ["--model", "m", "--cpu-kv-cache-bytes", "1048576", "--lora-max-wait-steps", "5"]
    )
    assert config.cpu_kv_cache_bytes == 1 << 20
    assert config.lora_max_wait_steps == 5
    assert parse_engine_args(engine_args(config))[0] == config
    default = EngineConfig(model="m")
    assert (default.cpu_kv_cache_bytes, default.lora_max_wait_steps) == (256 << 20, 32)
    with pytest.raises(ValueError, match="cpu_kv_cache_bytes"):
        EngineConfig(model="m", cpu_kv_cache_bytes=0)
    with pytest.raises(ValueError, match="lora_max_wait_steps"):
        EngineConfig(model="m", lora_max_wait_steps=-1)


def test_no_engine_default_hides_in_a_module_constant() -> None:
    assert not hasattr(engine_core, "CPU_KV_BUDGET")


def test_a_cpu_kv_budget_reaches_the_block_count(tiny: str) -> None:
    llm = LLM(tiny, max_loras=0, block_size=4, max_model_len=64, cpu_kv_cache_bytes=1 << 16)
    per_block = kv_cache_bytes_per_block(llm.core.model, 4, llm.core.kv_dtype)
    assert (1 << 16) // per_block < 2 * llm.config.max_num_seqs * 16  # the budget binds
    assert llm.core.pool.num_blocks == (1 << 16) // per_block


def test_the_starvation_bound_reaches_admission(tiny: str) -> None:
    llm = LLM(tiny, block_size=4, max_model_len=64, lora_max_wait_steps=5)
    runtime = llm.core.lora_runtime
    assert runtime is not None
    assert runtime.admission_policy.max_wait_steps == 5  # type: ignore[attr-defined]


def test_llm_and_engine_share_one_lora_default(tiny: str) -> None:
    """EngineConfig serves adapters by default (max_loras > 0), and so does LLM now."""
    assert EngineConfig(model=tiny).serves_adapters
    assert LLM(tiny, block_size=4, max_model_len=64).core.lora_runtime is not None
    assert LLM(tiny, block_size=4, max_model_len=64, max_loras=0).core.lora_runtime is None


def test_the_adapter_size_limit_is_a_flag(tiny: str) -> None:
    config, _ = parse_engine_args(["--model", tiny, "--adapter-max-bytes", "1000"])
    assert config.adapter_max_bytes == 1000
    assert parse_engine_args(engine_args(config))[0] == config
    assert EngineConfig(model="m").adapter_max_bytes == 512 << 20
    with pytest.raises(ValueError, match="adapter_max_bytes"):
        EngineConfig(model="m", adapter_max_bytes=0)


def test_the_adapter_size_limit_reaches_the_object_source(
    tiny: str, s3_storage, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    """An engine built with `adapter_max_bytes` refuses a bigger stored adapter, naming the
    limit, before reading it (the object source's limit is the config's, no other default)."""
    import hashlib
    import json

    from loraplex.adapters.peft_format import AdapterFormatError
    from loraplex.adapters.targets import resolve_config_targets
    from loraplex.loader.object_store import ObjectStore
    from loraplex.platform.engine.lora.runtime import LoraRuntime
    from loraplex.platform.engine.lora.sources import AdapterRef

    cfg = json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}).encode()
    weights = b"\0" * 4096  # refused on its size, before it is read or parsed
    for name, body in (("adapter_config.json", cfg), ("adapter_model.safetensors", weights)):
        s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + name, Body=body)
    llm = LLM(tiny, max_loras=0, block_size=4, max_model_len=64, adapter_max_bytes=1000)
    store = ObjectStore(s3_storage)
    runtime = LoraRuntime.for_engine(llm.core, object_store=store, max_loras=2)
    try:
        ref = AdapterRef(
            object_prefix=s3_prefix,
            sha256=hashlib.sha256(weights).hexdigest(),
            targets=resolve_config_targets(cfg, llm.core.model.hf_config).to_json(),
        )
        key, _ = runtime.resolve_adapter(ref)
        (source,) = runtime.fetcher.sources.copies(key)
        assert source.max_bytes == 1000
        fetch = runtime.fetcher.prefetch(key)
        assert fetch is not None
        with pytest.raises(AdapterFormatError, match="adapter_max_bytes=1000"):
            fetch.result(timeout=60)
    finally:
        runtime.detach()

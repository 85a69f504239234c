"""EngineConfig <-> `loraplex engine` options <-> deployment rows: one path, torch-free.

The command line is generated from EngineConfig's fields and parsed back to the same config;
a deployment row maps to a config (and so to a command line) in one function."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import pytest

from loraplex.loader.storage import StorageConfig
from loraplex.platform.engine_spec import (
    EngineConfig,
    ServerOptions,
    UnservableDeploymentError,
    build_engine_parser,
    engine_args,
    engine_args_for_deployment,
    engine_config_for_deployment,
    parse_engine_args,
)

LLAMA_8B = dict(
    architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
    num_attention_heads=32, num_key_value_heads=8,
)  # fmt: skip


CT_INT4 = {
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
        "symmetric": True}}},
}  # fmt: skip


def test_a_compressed_tensors_checkpoint_deploys_with_its_own_scheme() -> None:
    row = _row(weight_quantization="int4", config=dict(LLAMA_8B, quantization_config=CT_INT4))
    assert engine_config_for_deployment(row, bucket="lpx").quantization == "int4"


def _row(config=None, **kw):
    base = SimpleNamespace(
        name="llama-8b", object_prefix="models/llama-8b/", config=config or LLAMA_8B
    )
    fields = dict(
        name="dep", weight_quantization="bf16", kv_cache_dtype="auto", max_loras=12,
        max_lora_rank=32, expert_parallel_size=1, base_model=base,
    )  # fmt: skip
    return SimpleNamespace(**(fields | kw))


def test_config_to_argv_and_back_is_identity() -> None:
    config = EngineConfig(
        model="s3://bucket/models/moe",
        quantization="bf16",
        max_loras=3,
        max_lora_rank=16,
        cpu_threads=1,
        ep_size=4,
        ep_redundant_experts=2,
        eplb_interval=100,
        enable_prefix_caching=False,
        cuda_graph_sizes=[1, 2, 8],
        kv_cache_memory_bytes=1 << 28,
        gpu_memory_utilization=0.75,
        model_id="moe",
    )
    server = ServerOptions(host="0.0.0.0", port=9001, log_level="warning")
    argv = engine_args(config, server)
    assert argv[argv.index("--max-loras") + 1] == "3"
    assert argv[argv.index("--ep-size") + 1] == "4"
    assert "--no-enable-prefix-caching" in argv
    assert parse_engine_args(argv) == (config, server)


def test_defaults_give_the_shortest_command_line() -> None:
    assert engine_args(EngineConfig(model="/m")) == ["--model", "/m"]
    config, server = parse_engine_args(["--model", "/m"])
    assert config == EngineConfig(model="/m") and server == ServerOptions()


def test_every_field_but_storage_is_an_option() -> None:
    dests = {a.dest for a in build_engine_parser()._actions}
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert fields - dests == {"storage"}
    storage = StorageConfig(endpoint_url="http://s3", bucket="b", secret_key="never-on-argv")
    config = EngineConfig(model="/m", storage=storage)
    assert engine_args(config) == ["--model", "/m"]  # secrets travel in the environment
    assert parse_engine_args(["--model", "/m"], storage=storage)[0].storage is storage


def test_bad_values_are_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="block_size"):
        parse_engine_args(["--model", "/m", "--block-size", "12"])
    with pytest.raises(ValueError, match="ep_size"):
        EngineConfig(model="/m", ep_size=0)
    with pytest.raises(ValueError, match="cpu_threads"):
        parse_engine_args(["--model", "/m", "--cpu-threads", "0"])


def test_deployment_row_maps_to_one_config_and_command_line() -> None:
    row = _row(expert_parallel_size=2)
    config = engine_config_for_deployment(row, bucket="lpx", device="cuda:0")
    assert (config.model, config.model_id) == ("s3://lpx/models/llama-8b", "llama-8b")
    assert (config.quantization, config.max_loras, config.max_lora_rank, config.ep_size) == (
        "bf16", 12, 32, 2,
    )  # fmt: skip
    assert config.device == "cuda:0"
    argv = engine_args_for_deployment(row, ServerOptions(port=8200), bucket="lpx", device="cuda:0")
    assert parse_engine_args(argv) == (config, ServerOptions(port=8200))
    local = engine_config_for_deployment(row, model="/data/llama")
    assert local.model == "/data/llama" and local.model_id == "llama-8b"


@pytest.mark.parametrize("weights", ["int8", "int4", "fp8"])
def test_quantized_deployments_map_to_their_engine_options(weights: str) -> None:
    row = _row(weight_quantization=weights, kv_cache_dtype="fp8")
    config = engine_config_for_deployment(row, bucket="lpx", device="cuda:0")
    assert (config.quantization, config.kv_cache_dtype) == (weights, "fp8")
    assert config.dtype == "bfloat16"  # quantized weights, bf16 activations
    argv = engine_args_for_deployment(row, bucket="lpx", device="cuda:0")
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert parse_engine_args(argv)[0] == config


@pytest.mark.parametrize(
    ("row", "device", "match"),
    [(_row(weight_quantization="int4", config=dict(LLAMA_8B, hidden_size=4000)), None,
      "hidden_size=4000.* are not a multiple of 128; int8 or fp8 would work"),
     (_row(weight_quantization="int8"), "mps", "int8 weights run on cpu or cuda, not 'mps'"),
     (_row(kv_cache_dtype="fp8"), "mps", "fp8 KV cache runs on cpu or cuda"),
     (_row(config=dict(LLAMA_8B, quantization_config={"quant_method": "awq"})), None,
      r"pre-quantized \(awq\)"),
     (_row(weight_quantization="fp6"), None, "'fp6' is not implemented"),
     (_row(weight_quantization="int8", config=dict(LLAMA_8B, quantization_config=CT_INT4)),
      None, r"pre-quantized \(compressed-tensors int4\).*deploy it with weights int4")],
)  # fmt: skip
def test_unservable_deployments_are_refused(row, device, match: str) -> None:
    extra = {"device": device} if device else {}
    with pytest.raises(UnservableDeploymentError, match=match):
        engine_config_for_deployment(row, bucket="lpx", **extra)


def test_engine_spec_and_settings_import_without_torch() -> None:
    code = (
        "import sys, loraplex.platform.engine_spec, loraplex.platform.settings;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_auto_weights_compute_in_the_devices_native_type() -> None:
    """`auto` (the default for deployments, and `up`'s): no cast on load, the engine's
    dtype `auto` (bf16 where the CPU or GPU computes it natively, else fp32)."""
    config = engine_config_for_deployment(_row(weight_quantization="auto"), bucket="lpx")
    assert config.quantization is None and config.dtype == "auto"
    from loraplex.platform.services.deployments import DeploymentSpec

    assert DeploymentSpec(name="d", base_model="m").weight_quantization == "auto"


def test_auto_weights_take_a_prequantized_checkpoints_own_scheme() -> None:
    row = _row(weight_quantization="auto", config=dict(LLAMA_8B, quantization_config=CT_INT4))
    config = engine_config_for_deployment(row, bucket="lpx")
    assert config.quantization == "int4" and config.dtype == "bfloat16"

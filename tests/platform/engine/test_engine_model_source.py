"""Engines whose model streams from the real S3 server (`s3://bucket/prefix`): the same greedy
outputs as loading the local folder, sharded checkpoints, clear errors for bad objects (before
any weight is allocated), and a replica server started on an s3:// model."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from support.replica_wire import HEADERS, body, generate

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.loader.safetensors_header import SafetensorsError  # noqa: E402
from loraplex.loader.stream_reader import ChecksumMismatchError  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.engine_core import EngineCore  # noqa: E402
from loraplex.platform.engine.layers.onednn_weights import dense  # noqa: E402
from loraplex.platform.engine.model_source import ModelSourceError, parse_s3_url  # noqa: E402
from loraplex.platform.engine.models.llama import LlamaForCausalLM  # noqa: E402
from loraplex.platform.engine_spec.cli import parse_engine_args  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402
from loraplex.platform.local_processes import start_engine_process  # noqa: E402
from loraplex.platform.settings import Settings  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS: list = ["hello there", [5, 6, 7, 8], "the quick brown fox"]
ENGINE = dict(block_size=8, max_num_seqs=8, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def s3_settings(s3_endpoint: str) -> Settings:
    """Settings reaching only the S3 server; the bucket comes from the s3:// URL, not from here."""
    return Settings(
        s3_endpoint_url=s3_endpoint, s3_bucket="not-the-model-bucket", loader_chunk_bytes=8192
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model(path, "llama", seed=3)
    return path


def upload(s3_client, bucket: str, prefix: str, folder: Path, **extra) -> str:
    """Put every file of `folder` under `prefix`; return the model's s3:// URL."""
    for f in sorted(folder.iterdir()):
        s3_client.put_object(Bucket=bucket, Key=prefix + f.name, Body=f.read_bytes(), **extra)
    return f"s3://{bucket}/{prefix}"


def outputs(llm: LLM) -> list[tuple[list[int], str]]:
    return [(o.outputs[0].token_ids, o.outputs[0].text) for o in llm.generate(PROMPTS, GREEDY)]


def test_parse_s3_url() -> None:
    assert parse_s3_url("s3://b/models/tiny/") == ("b", "models/tiny")
    assert parse_s3_url("s3://b") == ("b", "")
    with pytest.raises(ModelSourceError, match="names no bucket"):
        parse_s3_url("s3:///x")


def test_s3_model_matches_local_load(
    tiny: Path, s3_client, s3_bucket: str, s3_prefix: str, s3_settings: Settings
) -> None:
    url = upload(s3_client, s3_bucket, s3_prefix, tiny)
    local = LLM(str(tiny), **ENGINE)
    remote = LLM(url, storage=s3_settings.storage(), **ENGINE)
    local_sd, remote_sd = local.core.model.state_dict(), remote.core.model.state_dict()
    assert local_sd.keys() == remote_sd.keys()
    assert all(torch.equal(dense(local_sd[k]), dense(remote_sd[k])) for k in local_sd)
    assert remote.get_tokenizer() is not None
    assert remote.core.eos_token_ids == local.core.eos_token_ids
    assert outputs(remote) == outputs(local)
    assert remote.core.model_id == url.rstrip("/")
    seconds = remote.core.timeline.seconds
    assert {"header", "fetch", "device_copy", "ready"} <= set(seconds)


def test_sharded_checkpoint_from_s3(
    tmp_path: Path, s3_client, s3_bucket: str, s3_prefix: str, s3_settings: Settings
) -> None:
    save_tiny_model(tmp_path, "llama", seed=5, max_shard_size="60KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) >= 3 and (tmp_path / "model.safetensors.index.json").is_file()
    url = upload(s3_client, s3_bucket, s3_prefix, tmp_path)
    remote = LLM(url, storage=s3_settings.storage(), **ENGINE)
    assert outputs(remote) == outputs(LLM(str(tmp_path), **ENGINE))


def test_bf16_quantization_streams_like_local(
    tiny: Path, s3_client, s3_bucket: str, s3_prefix: str, s3_settings: Settings
) -> None:
    url = upload(s3_client, s3_bucket, s3_prefix, tiny)
    remote = LLM(url, storage=s3_settings.storage(), quantization="bf16", **ENGINE)
    local = LLM(str(tiny), quantization="bf16", **ENGINE)
    remote_sd, local_sd = remote.core.model.state_dict(), local.core.model.state_dict()
    assert {t.dtype for t in remote_sd.values()} == {torch.bfloat16}
    assert all(torch.equal(dense(local_sd[k]), dense(remote_sd[k])) for k in local_sd)
    assert "quantize" in remote.core.timeline.seconds


def _corrupt_header(path: Path) -> None:
    """Claim a header far longer than the file: the reader must refuse it from 8 bytes."""
    raw = bytearray(path.read_bytes())
    raw[:8] = struct.pack("<Q", len(raw) * 4)
    path.write_bytes(bytes(raw))


def test_corrupt_weights_fail_before_any_weight_is_allocated(
    tmp_path: Path,
    s3_client,
    s3_bucket: str,
    s3_prefix: str,
    s3_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    save_tiny_model(tmp_path, "llama", with_tokenizer=False)
    _corrupt_header(tmp_path / "model.safetensors")
    url = upload(s3_client, s3_bucket, s3_prefix, tmp_path)

    def no_allocation(*args, **kwargs):  # building the model would allocate its weights
        raise AssertionError("the model was built before the checkpoint was validated")

    monkeypatch.setattr(LlamaForCausalLM, "__init__", no_allocation)
    with pytest.raises(SafetensorsError, match="model.safetensors"):
        EngineCore(EngineConfig(url, storage=s3_settings.storage(), **ENGINE))


def test_checksum_mismatch_is_a_clear_error(
    tmp_path: Path, s3_client, s3_bucket: str, s3_prefix: str, s3_settings: Settings
) -> None:
    save_tiny_model(tmp_path, "llama", with_tokenizer=False)
    url = upload(s3_client, s3_bucket, s3_prefix, tmp_path, Metadata={"sha256": "0" * 64})
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        EngineCore(EngineConfig(url, storage=s3_settings.storage(), **ENGINE))


def test_missing_files_and_settings_are_clear_errors(
    tiny: Path, s3_client, s3_bucket: str, s3_prefix: str, s3_settings: Settings
) -> None:
    url = f"s3://{s3_bucket}/{s3_prefix}"
    with pytest.raises(ModelSourceError, match="no config.json"):
        EngineCore(EngineConfig(url, storage=s3_settings.storage(), **ENGINE))
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "config.json", Body=(tiny / "config.json").read_bytes()
    )
    with pytest.raises(Exception, match="model.safetensors"):
        EngineCore(EngineConfig(url, storage=s3_settings.storage(), **ENGINE))
    with pytest.raises(ModelSourceError, match="StorageConfig"):
        EngineCore(EngineConfig(url, **ENGINE))


def test_cli_options_reach_the_config(s3_settings: Settings) -> None:
    argv = ["--model", "s3://b/m", "--quantization", "bf16", "--enforce-eager",
            "--cuda-graph-sizes", "1,2,8"]  # fmt: skip
    storage = s3_settings.storage()
    config, _ = parse_engine_args(argv, storage=storage)
    assert config.storage is storage and config.quantization == "bf16"
    assert config.enforce_eager and config.cuda_graph_sizes == [1, 2, 8]


@pytest.fixture
def s3_server(
    tiny: Path, s3_client, s3_bucket: str, s3_prefix: str, s3_endpoint: str, tmp_path: Path
) -> Iterator[tuple[str, Path]]:
    """`loraplex engine --model s3://...` as a real process; the object store comes from env."""
    url = upload(s3_client, s3_bucket, s3_prefix, tiny)
    env = {**os.environ, "LORAPLEX_S3_ENDPOINT_URL": s3_endpoint, "LORAPLEX_S3_BUCKET": "other"}
    log = tmp_path / "engine.log"
    config = EngineConfig(url, block_size=8, max_loras=0)
    base, proc = start_engine_process(config, log, env, timeout=90)
    try:
        yield base, log
    finally:
        proc.stop(timeout=30)


def test_server_on_s3_model_serves_and_exports_cold_start(
    s3_server: tuple[str, Path], tiny: Path
) -> None:
    s3_server, log = s3_server
    offline = LLM(str(tiny), **ENGINE)
    ids = offline.get_tokenizer().encode("hello there")
    got = generate(s3_server, body(ids, max_tokens=10, temperature=0, ignore_eos=True))
    expected = offline.generate([ids], GREEDY)[0].outputs[0]
    assert got.token_ids == expected.token_ids
    assert got.text == expected.text
    metrics = httpx.get(s3_server + "/metrics", headers=HEADERS).text

    def samples(name: str) -> dict[str, float]:
        out = {}
        for line in metrics.splitlines():
            if line.startswith(name + "{"):
                labels, _, value = line.rpartition(" ")
                out[labels.split('phase="')[1].split('"')[0]] = float(value)
        return out

    seconds = samples("loraplex:cold_start_phase_seconds")
    assert {"header", "fetch", "device_copy", "ready"} <= set(seconds)
    assert seconds["ready"] >= seconds["fetch"] > 0
    assert samples("loraplex:cold_start_phase_skipped") == {"warmup": 1.0, "graph_capture": 1.0}
    assert "cold start of" in log.read_text()  # the timeline is logged too

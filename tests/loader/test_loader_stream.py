"""The streaming loader against the real S3 server (SeaweedFS), directly and through a proxy
that counts bytes and injects faults (503s, connections dropped before or mid-body)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save, save_file

from loraplex.loader.checkpoint_index import CheckpointLayoutError
from loraplex.loader.object_store import (
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    RetryPolicy,
)
from loraplex.loader.quant import Quantizer
from loraplex.loader.safetensors_header import SafetensorsError
from loraplex.loader.select import contiguous_experts, expert_index, expert_selector
from loraplex.loader.storage import StorageConfig
from loraplex.loader.stream_reader import (
    ChecksumMismatchError,
    StreamConfig,
    StreamLoader,
    open_loader,
)

SMALL = StreamConfig(chunk_bytes=4096, concurrency=4, header_probe_bytes=256)


def _dtypes() -> list[torch.dtype]:
    out = [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    ]
    extra = ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
    out += [getattr(torch, n) for n in extra if hasattr(torch, n)]
    return out


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 3).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=gen).to(dtype)


def _checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, dtype in enumerate(_dtypes()):
        tensors[f"layers.{i}.w"] = _tensor(dtype, (37 + 11 * i, 29), gen)
        tensors[f"layers.{i}.b"] = _tensor(dtype, (3,), gen)
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.zeros(0, 8)
    tensors["big"] = torch.randn(50_000, generator=gen)  # spans many 4 KiB ranges
    return tensors


def _assert_same(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert got.keys() == ref.keys()
    for name, want in ref.items():
        have = got[name]
        assert have.dtype == want.dtype and have.shape == want.shape, name
        # Compare bytes: exact for every dtype (NaN payloads and -0.0 included).
        assert torch.equal(have.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


@pytest.fixture
def store(s3_storage: StorageConfig) -> ObjectStore:
    return ObjectStore(s3_storage, max_pool_connections=16)


def _put_file(s3_client, bucket: str, key: str, path: Path, **extra) -> None:
    s3_client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), **extra)


def test_single_file_all_dtypes_identical_to_load_file(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_checkpoint(), path, metadata={"format": "pt"})
    _put_file(s3_client, s3_bucket, s3_prefix + "model.safetensors", path)
    loader = StreamLoader(store, SMALL)
    _assert_same(loader.load(s3_prefix), load_file(path))
    assert "header" in loader.timeline.seconds and "fetch" in loader.timeline.seconds


def test_large_header_needs_a_second_read(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str, tmp_path: Path
) -> None:
    tensors = {f"t{i:04d}": torch.full((2,), float(i)) for i in range(300)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, path)
    _put_file(s3_client, s3_bucket, s3_prefix + "m.safetensors", path)
    got = StreamLoader(store, StreamConfig(header_probe_bytes=64)).load(s3_prefix + "m.safetensors")
    _assert_same(got, load_file(path))


def _write_sharded(tmp_path: Path, s3_client, bucket: str, prefix: str) -> dict[str, torch.Tensor]:
    tensors = _checkpoint(seed=1)
    names = sorted(tensors)
    shards = [names[0::3], names[1::3], names[2::3]]
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({n: tensors[n] for n in shard}, tmp_path / fname)
        _put_file(s3_client, bucket, prefix + fname, tmp_path / fname)
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    s3_client.put_object(
        Bucket=bucket, Key=prefix + "model.safetensors.index.json", Body=json.dumps(index).encode()
    )
    ref: dict[str, torch.Tensor] = {}
    for i in range(3):
        ref.update(load_file(tmp_path / f"model-{i + 1:05d}-of-00003.safetensors"))
    return ref


def test_sharded_checkpoint_identical_to_load_file(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str, tmp_path: Path
) -> None:
    ref = _write_sharded(tmp_path, s3_client, s3_bucket, s3_prefix)
    loader = StreamLoader(store, SMALL)
    assert len(loader.resolve(s3_prefix).keys) == 3
    _assert_same(loader.load(s3_prefix), ref)


def test_sharded_index_that_lies_is_rejected(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str, tmp_path: Path
) -> None:
    _write_sharded(tmp_path, s3_client, s3_bucket, s3_prefix)
    key = s3_prefix + "model.safetensors.index.json"
    index = json.loads(s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    name = next(iter(index["weight_map"]))
    other = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"}
    index["weight_map"][name] = sorted(other - {index["weight_map"][name]})[0]
    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(index).encode())
    with pytest.raises(CheckpointLayoutError, match=name):
        StreamLoader(store, SMALL).load(s3_prefix)


def test_missing_checkpoint_is_not_found(store: ObjectStore, s3_prefix: str) -> None:
    with pytest.raises(ObjectNotFoundError, match="model.safetensors"):
        StreamLoader(store, SMALL).load(s3_prefix)


def test_name_filter_fetches_only_selected_tensors(
    fault_proxy,
    s3_storage: StorageConfig,
    s3_client,
    s3_bucket: str,
    s3_prefix: str,
    tmp_path: Path,
) -> None:
    path = tmp_path / "model.safetensors"
    ref = _checkpoint()
    ref["experts.0.w"] = torch.randn(20_000)
    ref["experts.1.w"] = torch.randn(20_000)
    save_file(ref, path)
    _put_file(s3_client, s3_bucket, s3_prefix + "model.safetensors", path)
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        store = ObjectStore(replace(s3_storage, endpoint_url=proxy.url))
        loader = StreamLoader(store, SMALL)
        got = loader.load(s3_prefix, select=lambda n: n.startswith("experts.1"))
    assert list(got) == ["experts.1.w"]
    assert torch.equal(got["experts.1.w"], ref["experts.1.w"])
    # Only the header probe and the selected expert's bytes came over the wire.
    assert proxy.body_bytes < SMALL.header_probe_bytes + 80_000 + 4096
    by_set = StreamLoader(store, SMALL).load(s3_prefix, select={"scalar", "layers.0.w"})
    _assert_same(by_set, {k: ref[k] for k in ("scalar", "layers.0.w")})
    with pytest.raises(KeyError, match="nope"):
        StreamLoader(store, SMALL).load(s3_prefix, select={"nope"})


def test_tensors_are_yielded_while_later_ranges_are_in_flight(
    fault_proxy, s3_storage: StorageConfig, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    tensors = {f"t{i:02d}": torch.randn(8192) for i in range(40)}  # 32 KiB each
    blob = save(tensors)
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "model.safetensors", Body=blob)
    cfg = StreamConfig(
        chunk_bytes=32 * 1024, concurrency=2, window_bytes=64 * 1024, header_probe_bytes=4096
    )
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        store = ObjectStore(replace(s3_storage, endpoint_url=proxy.url))
        stream = StreamLoader(store, cfg).iter_tensors(s3_prefix)
        name, first = next(stream)
        seen_at_first = proxy.body_bytes
        rest = dict(stream)
    assert torch.equal(first, tensors[name])
    assert seen_at_first < len(blob) // 2  # bounded window: most bytes were still to come
    _assert_same({name: first, **rest}, tensors)


def test_sha256_recorded_in_metadata_is_verified(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    blob = save(_checkpoint())
    good, bad = hashlib.sha256(blob).hexdigest(), hashlib.sha256(b"other").hexdigest()
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "ok.safetensors", Body=blob, Metadata={"sha256": good}
    )
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "bad.safetensors", Body=blob, Metadata={"sha256": bad}
    )
    loader = StreamLoader(store, SMALL)
    assert len(loader.load(s3_prefix + "ok.safetensors")) == len(_checkpoint())
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        loader.load(s3_prefix + "bad.safetensors")
    no_data = save({"e": torch.zeros(0)})
    key = s3_prefix + "nodata.safetensors"
    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=no_data, Metadata={"sha256": bad})
    with pytest.raises(ChecksumMismatchError):
        loader.load(key)
    with pytest.raises(ChecksumMismatchError, match=bad):
        loader.load(
            s3_prefix + "ok.safetensors", expected_sha256={s3_prefix + "ok.safetensors": bad}
        )


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda h: h["a"].update(data_offsets=[0, 12]), "size mismatch"),
        (lambda h: h["b"].update(data_offsets=[12, 28]), "overlap"),
        (lambda h: h["a"].update(dtype="X9"), "unknown dtype"),
    ],
)
def test_malformed_object_rejected_before_any_data_read(
    fault_proxy,
    s3_storage: StorageConfig,
    s3_client,
    s3_bucket: str,
    s3_prefix: str,
    mutate,
    rule: str,
) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]},
    }
    mutate(header)
    raw = json.dumps(header).encode()
    blob = len(raw).to_bytes(8, "little") + raw + bytes(32 + 4096)
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "model.safetensors", Body=blob)
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        store = ObjectStore(replace(s3_storage, endpoint_url=proxy.url))
        with pytest.raises(SafetensorsError, match=rule):
            StreamLoader(store, SMALL).load(s3_prefix + "model.safetensors")
    assert proxy.gets == 1  # the header probe only: no weight range was ever requested


def test_short_and_oversized_headers_rejected(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "empty.safetensors", Body=b"")
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "huge.safetensors", Body=b"\xff" * 64)
    loader = StreamLoader(store, SMALL)
    with pytest.raises(SafetensorsError, match="too short"):
        loader.load(s3_prefix + "empty.safetensors")
    with pytest.raises(SafetensorsError, match="header too large"):
        loader.load(s3_prefix + "huge.safetensors")


def test_quantizer_applied_on_the_way_in(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    ref = {"layer.w.weight": torch.randn(16, 8), "ids": torch.arange(5)}
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "model.safetensors", Body=save(ref))
    got = StreamLoader(store, SMALL).load(s3_prefix, quantizer=Quantizer("bf16"))
    assert got["layer.w.weight"].dtype == torch.bfloat16
    assert torch.equal(got["layer.w.weight"], ref["layer.w.weight"].bfloat16())
    assert torch.equal(got["ids"], ref["ids"])


def test_faulty_server_is_survived_by_retries(
    fault_proxy,
    s3_storage: StorageConfig,
    s3_client,
    s3_bucket: str,
    s3_prefix: str,
    tmp_path: Path,
) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_checkpoint(), path)
    _put_file(s3_client, s3_bucket, s3_prefix + "model.safetensors", path)
    with fault_proxy(s3_storage.endpoint_url, fail_every=3) as proxy:
        retry = RetryPolicy(max_attempts=8, base_delay_s=0.001, max_delay_s=0.01)
        store = ObjectStore(replace(s3_storage, endpoint_url=proxy.url, retry=retry))
        got = StreamLoader(store, SMALL).load(s3_prefix)
    _assert_same(got, load_file(path))
    assert set(proxy.faults) == {"503", "drop-before", "drop-mid-body"}
    assert store.retries >= sum(proxy.faults.values()) > 0


def test_retries_give_up_with_a_clear_error(
    fault_proxy, s3_storage: StorageConfig, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "m.safetensors", Body=save(_checkpoint())
    )
    with fault_proxy(s3_storage.endpoint_url, fail_every=1) as proxy:
        retry = RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01)
        store = ObjectStore(replace(s3_storage, endpoint_url=proxy.url, retry=retry))
        with pytest.raises(ObjectStoreError, match="after 3 attempts"):
            StreamLoader(store, SMALL).load(s3_prefix + "m.safetensors")


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [
        t.name
        for t in threading.enumerate()
        if t.ident not in before and t.name.startswith("loraplex-fetch")
    ]
    assert not leaked, f"fetch threads left running: {leaked}"


def test_cuda_target(store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str) -> None:
    ref = _checkpoint()
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "model.safetensors", Body=save(ref))
    loader = StreamLoader(store, SMALL)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            loader.load(s3_prefix, device="cuda")
        return
    got = loader.load(s3_prefix, device="cuda")
    assert all(t.device.type == "cuda" for t in got.values())
    _assert_same({k: v.cpu() for k, v in got.items()}, ref)
    assert "device_copy" in loader.timeline.seconds


def test_expert_parallel_rank_fetches_only_its_experts(
    s3_storage: StorageConfig, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    gen = torch.Generator().manual_seed(3)
    ref = {"model.embed_tokens.weight": torch.randn(32, 8, generator=gen)}
    for e in range(4):
        for w in ("w1", "w2", "w3"):
            name = f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"
            ref[name] = torch.randn(16, 8, generator=gen)
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "model.safetensors", Body=save(ref))
    loader = open_loader(s3_storage)
    owned = contiguous_experts(rank=1, world_size=2, num_experts=4)
    got = loader.load(s3_prefix, select=expert_selector(owned))
    want = {k: v for k, v in ref.items() if expert_index(k) in (None, 2, 3)}
    _assert_same(got, want)
    assert len(got) == 1 + 2 * 3


def test_staging_pool_path_matches_and_checks_sha256(
    store: ObjectStore, s3_client, s3_bucket: str, s3_prefix: str
) -> None:
    """The GPU path's bookkeeping (bounded slots, in-order hashing, copies) run on CPU."""
    ref = _checkpoint(seed=5)
    blob = save(ref)
    sha = hashlib.sha256(blob).hexdigest()
    key = s3_prefix + "model.safetensors"
    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=blob, Metadata={"sha256": sha})
    cfg = StreamConfig(chunk_bytes=4096, concurrency=4, window_bytes=3 * 4096)
    loader = StreamLoader(store, cfg)
    _assert_same(loader.load(key, staging=True), ref)
    assert "device_copy" in loader.timeline.seconds
    with pytest.raises(ChecksumMismatchError):
        loader.load(key, staging=True, expected_sha256={key: "0" * 64})

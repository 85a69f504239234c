"""The node-local weight cache against the real S3 server (SeaweedFS), behind a proxy that
counts GETs and body bytes: a replica's second cold start on a node reads no weight bytes
from S3, a changed object is fetched again, a partial or damaged copy is never served."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from loraplex.loader.node_cache import NodeCache
from loraplex.loader.storage import StorageConfig
from loraplex.loader.stream_reader import StreamConfig, open_loader


def _checkpoint(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.w": torch.randn(64, 257, generator=gen) for i in range(12)}


def _load(storage: StorageConfig, key: str, **kw: object) -> dict[str, torch.Tensor]:
    loader = open_loader(storage)
    loader.config = StreamConfig(chunk_bytes=8192, concurrency=4, header_probe_bytes=512)
    return loader.load(key, **kw)  # type: ignore[arg-type]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture
def put(s3_client, s3_bucket: str, s3_prefix: str):
    def put(tensors: dict[str, torch.Tensor]) -> str:
        key = s3_prefix + "model.safetensors"
        s3_client.put_object(Bucket=s3_bucket, Key=key, Body=save(tensors))
        return key

    return put


def test_second_cold_start_on_a_node_reads_no_weight_bytes_from_s3(
    fault_proxy, s3_storage: StorageConfig, put, tmp_path: Path
) -> None:
    ref = _checkpoint(0)
    key = put(ref)
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        storage = replace(s3_storage, endpoint_url=proxy.url, local_cache_dir=str(tmp_path))
        _same(_load(storage, key), ref)
        first_gets, first_bytes = proxy.gets, proxy.body_bytes
        assert first_bytes >= sum(t.numel() * 4 for t in ref.values())  # it came from S3
        _same(_load(storage, key), ref)  # a fresh loader: the replica's second cold start
        assert proxy.gets == first_gets  # a HEAD to check the version, no GET at all
        assert proxy.body_bytes == first_bytes


def test_without_a_cache_dir_every_cold_start_streams_from_s3(
    fault_proxy, s3_storage: StorageConfig, put
) -> None:
    """The control: the same two loads with no cache directory fetch the weights twice."""
    ref = _checkpoint(1)
    key = put(ref)
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        storage = replace(s3_storage, endpoint_url=proxy.url)
        _same(_load(storage, key), ref)
        first_bytes = proxy.body_bytes
        _same(_load(storage, key), ref)
        assert proxy.body_bytes >= 2 * first_bytes - 1024


def test_an_object_replaced_in_s3_is_fetched_again(
    fault_proxy, s3_storage: StorageConfig, put, tmp_path: Path
) -> None:
    key = put(_checkpoint(2))
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        storage = replace(s3_storage, endpoint_url=proxy.url, local_cache_dir=str(tmp_path))
        _load(storage, key)
        newer = _checkpoint(3)
        put(newer)  # same key, other bytes: another ETag
        before = proxy.body_bytes
        _same(_load(storage, key), newer)
        assert proxy.body_bytes > before
        after = proxy.body_bytes
        _same(_load(storage, key), newer)  # and the new version is what is kept
        assert proxy.body_bytes == after


def test_a_partial_read_is_not_kept(
    fault_proxy, s3_storage: StorageConfig, put, tmp_path: Path
) -> None:
    """A rank that reads some tensors only (expert or tensor parallel) leaves no copy: a copy
    is served only when every byte of the file went through the cache."""
    ref = _checkpoint(4)
    key = put(ref)
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        storage = replace(s3_storage, endpoint_url=proxy.url, local_cache_dir=str(tmp_path))
        _load(storage, key, select={"layers.0.w"})
        assert NodeCache(tmp_path).entries() == []
        before = proxy.body_bytes
        _same(_load(storage, key), ref)
        assert proxy.body_bytes - before >= sum(t.numel() * 4 for t in ref.values())
    assert [e.key for e in NodeCache(tmp_path).entries()] == [key]
    assert not list(tmp_path.rglob("*.partial*"))  # no leftovers


def test_a_damaged_copy_is_dropped_and_fetched_again(
    fault_proxy, s3_storage: StorageConfig, put, tmp_path: Path
) -> None:
    ref = _checkpoint(5)
    key = put(ref)
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        storage = replace(s3_storage, endpoint_url=proxy.url, local_cache_dir=str(tmp_path))
        _load(storage, key)
        (entry,) = NodeCache(tmp_path).entries()
        with open(entry.path, "r+b") as f:  # a torn write: the copy is shorter than recorded
            f.truncate(entry.size // 2)
        before = proxy.body_bytes
        _same(_load(storage, key), ref)
        assert proxy.body_bytes > before
    (entry,) = NodeCache(tmp_path).entries()
    assert entry.path.stat().st_size == entry.size


def test_the_cache_keeps_under_its_byte_limit_dropping_the_least_recently_used(
    s3_storage: StorageConfig, s3_client, s3_bucket: str, s3_prefix: str, tmp_path: Path
) -> None:
    blobs = {f"{s3_prefix}m{i}.safetensors": save(_checkpoint(10 + i)) for i in range(3)}
    for key, blob in blobs.items():
        s3_client.put_object(Bucket=s3_bucket, Key=key, Body=blob)
    size = max(len(b) for b in blobs.values())
    storage = replace(
        s3_storage, local_cache_dir=str(tmp_path), local_cache_max_bytes=2 * size + 100
    )
    a, b, c = blobs
    _load(storage, a)
    _load(storage, b)
    _load(storage, a)  # a is now the most recently used
    _load(storage, c)  # over the limit: b goes
    assert sorted(e.key for e in NodeCache(tmp_path).entries()) == sorted([a, c])


def test_the_platform_settings_reach_the_loader(monkeypatch, tmp_path: Path) -> None:
    """`LORAPLEX_WEIGHTS_CACHE_DIR` (the engine pod's hostPath) turns the cache on."""
    from loraplex.platform.settings import Settings

    monkeypatch.setenv("LORAPLEX_WEIGHTS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LORAPLEX_WEIGHTS_CACHE_MAX_BYTES", "1000")
    storage = Settings().storage()
    assert (storage.local_cache_dir, storage.local_cache_max_bytes) == (str(tmp_path), 1000)


def test_a_copy_that_fails_its_checksum_is_dropped_so_the_next_start_refetches(
    fault_proxy,
    s3_storage: StorageConfig,
    s3_client,
    s3_bucket: str,
    s3_prefix: str,
    tmp_path: Path,
) -> None:
    """Bit rot in a kept copy (same size, other bytes) fails the sha256 recorded on the
    object, as S3's own bytes would; the copy is dropped then, so a restarted replica loads
    from S3 again instead of failing on the same copy forever."""
    import hashlib

    from loraplex.loader.stream_reader import ChecksumMismatchError

    ref = _checkpoint(6)
    blob = save(ref)
    key = s3_prefix + "model.safetensors"
    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=blob,
                         Metadata={"sha256": hashlib.sha256(blob).hexdigest()})  # fmt: skip
    with fault_proxy(s3_storage.endpoint_url) as proxy:
        storage = replace(s3_storage, endpoint_url=proxy.url, local_cache_dir=str(tmp_path))
        _same(_load(storage, key), ref)
        (entry,) = NodeCache(tmp_path).entries()
        with open(entry.path, "r+b") as f:
            f.seek(entry.size - 100)
            byte = f.read(1)
            f.seek(entry.size - 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(ChecksumMismatchError, match="dropped"):
            _load(storage, key)
        assert NodeCache(tmp_path).entries() == []
        before = proxy.body_bytes
        _same(_load(storage, key), ref)
        assert proxy.body_bytes - before >= len(blob)
    assert len(NodeCache(tmp_path).entries()) == 1


def test_two_replicas_filling_one_file_leave_one_good_copy(tmp_path: Path) -> None:
    """Two replicas on a node cold-start the same model at once: both fill, the first to
    finish keeps its copy, the other's finish neither replaces nor removes it."""
    from loraplex.loader.object_store import ObjectInfo

    cache = NodeCache(tmp_path)
    data = bytes(range(256)) * 64
    info = ObjectInfo("models/m/model.safetensors", len(data), None, '"etag-1"')
    first, second = cache.start_fill("b", info), cache.start_fill("b", info)
    assert first is not None and second is not None
    first.write(0, [data[:1000]])
    second.write(0, [data])  # finishes first: kept
    first.write(1000, [data[1000:]])  # finishes second: its partial was removed, not kept
    assert (second.state, first.state) == ("kept", "dropped")
    (entry,) = cache.entries()
    assert entry.path.read_bytes() == data
    assert cache.lookup("b", info) == entry.path
    assert not list(tmp_path.rglob("*.partial*"))

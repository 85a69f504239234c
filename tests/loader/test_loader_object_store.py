"""The loader's S3 client against the real server: sizes, ranges, errors, retry classification."""

from __future__ import annotations

import http.client

import botocore.exceptions
import pytest

from loraplex.loader.object_store import (
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    RetryPolicy,
    ShortReadError,
    is_transient,
)


@pytest.fixture
def store(s3_storage) -> ObjectStore:
    return ObjectStore(s3_storage)


def test_head_range_and_prefix(store, s3_client, s3_bucket, s3_prefix) -> None:
    data = bytes(range(256)) * 40
    key = s3_prefix + "obj"
    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=data, Metadata={"sha256": "AB" * 32})
    assert store.head(key) == len(data)
    assert store.stat(key).sha256 == "ab" * 32
    assert store.get_range(key, 100, 1100) == data[100:1100]
    assert store.get_range(key, 5, 5) == b""
    buf1, buf2 = bytearray(10), bytearray(20)
    store.get_range_into(key, 7, [memoryview(buf1), memoryview(buf2)])
    assert bytes(buf1 + buf2) == data[7:37]
    prefix, info = store.read_prefix(key, 64)
    assert prefix == data[:64] and info.size == len(data) and info.sha256 == "ab" * 32
    whole, info = store.read_prefix(key, 10**6)
    assert whole == data and info.size == len(data)


def test_reads_past_the_end_and_missing_objects_fail_clearly(
    store, s3_client, s3_bucket, s3_prefix
) -> None:
    key = s3_prefix + "small"
    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=b"0123456789")
    with pytest.raises(ObjectStoreError, match="small"):
        store.get_range(key, 5, 50)
    with pytest.raises(ObjectNotFoundError, match="not found"):
        store.head(s3_prefix + "missing")
    with pytest.raises(ObjectNotFoundError):
        store.get_range(s3_prefix + "missing", 0, 4)
    empty = s3_prefix + "empty"
    s3_client.put_object(Bucket=s3_bucket, Key=empty, Body=b"")
    assert store.read_prefix(empty, 8)[0] == b""
    assert store.read_prefix(empty, 8)[1].size == 0


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


def test_transient_errors_are_told_apart() -> None:
    assert is_transient(_client_error(503, "SlowDown"))
    assert is_transient(_client_error(500, "InternalError"))
    assert is_transient(_client_error(400, "RequestTimeout"))
    assert is_transient(ShortReadError("short"))
    assert is_transient(http.client.IncompleteRead(b""))
    assert is_transient(ConnectionResetError())
    assert is_transient(botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"))
    assert not is_transient(_client_error(404, "NoSuchKey"))
    assert not is_transient(_client_error(403, "AccessDenied"))
    assert not is_transient(ValueError("x"))


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=5, base_delay_s=0.1, max_delay_s=0.5)
    for attempt in range(1, 8):
        cap = min(0.5, 0.1 * 2 ** (attempt - 1))
        assert all(0 <= policy.delay(attempt) <= cap for _ in range(50))


def test_body_reader_fallback_fills_views_and_counts_short_or_long_bodies() -> None:
    import io

    from loraplex.loader.object_store import _fill_from_body

    a, b = bytearray(3), bytearray(4)
    assert _fill_from_body(io.BytesIO(b"abcdefg"), [memoryview(a), memoryview(b)]) == 7
    assert bytes(a + b) == b"abcdefg"
    assert _fill_from_body(io.BytesIO(b"abc"), [memoryview(bytearray(5))]) == 3
    assert _fill_from_body(io.BytesIO(b"abcdef"), [memoryview(bytearray(5))]) == 6

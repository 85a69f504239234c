"""A thin, fast S3 client for the loader: sizes, ranged reads into caller buffers, retries.

Built from the loader's `StorageConfig` with a connection pool sized for many concurrent ranged GETs. Range
bodies are read straight from the socket into the caller's memory (no intermediate bytes
object) where the HTTP stack allows it, and every read is checked for its exact length.
Transient failures (5xx, throttling, dropped or short connections) are retried with
exponential backoff and jitter; anything else fails at once.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import boto3
import botocore.exceptions
from botocore.config import Config

from loraplex.loader.storage import RetryPolicy, StorageConfig

__all__ = [
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectReader",
    "ObjectStore",
    "ObjectStoreError",
    "RetryPolicy",
    "is_not_found",
    "make_s3_client",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "ServiceUnavailable",
        "InternalError",
        "503",
        "500",
        "502",
        "504",
    }
)


class ObjectReader(Protocol):
    """The reads a checkpoint's index and the sinks make: an `ObjectStore`, or the node
    cache's `CachedStore` over one."""

    def head(self, key: str) -> int:
        """The object's size in bytes."""
        ...

    def find(self, key: str) -> ObjectInfo | None:
        """The object's info from a listing of its exact key; None when it does not exist."""
        ...

    def read_prefix(self, key: str, n: int) -> tuple[bytes, ObjectInfo]:
        """The object's first min(n, size) bytes and its info."""
        ...

    def get_range_into(self, key: str, start: int, views: Sequence[memoryview]) -> None:
        """Fill `views` (in order) with the object's bytes from `start`."""
        ...


class ObjectStoreError(RuntimeError):
    """An object-store call failed for good (missing object, denied, or retries exhausted)."""


class ObjectNotFoundError(ObjectStoreError):
    """The object (or bucket) does not exist."""


class ShortReadError(ConnectionError):
    """The server sent fewer (or more) bytes than the range asked for; retryable."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a HEAD tells us about an object."""

    key: str
    size: int
    sha256: str | None
    """Hex sha256 recorded in the object's user metadata (`x-amz-meta-sha256`), if any."""
    etag: str | None = None
    """The object's ETag: changes whenever the object is written again (the node cache's check)."""


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: 5xx, throttling, timeouts, dropped or short connections."""
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or status == 429 or str(err.get("Code")) in _TRANSIENT_CODES
    return isinstance(
        exc,
        (
            botocore.exceptions.ConnectionError,
            botocore.exceptions.HTTPClientError,
            botocore.exceptions.ReadTimeoutError,
            botocore.exceptions.ResponseStreamingError,
            botocore.exceptions.IncompleteReadError,
            http.client.HTTPException,
            ConnectionError,
            TimeoutError,
        ),
    )


_SESSION = boto3.session.Session()
_SESSION_LOCK = threading.Lock()
"""Clients are made from one session: a fresh one reloads botocore's service models (tens
of ms per client); a session is not thread-safe, so clients are made under the lock."""

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload"})


def is_not_found(exc: BaseException) -> bool:
    """True when a boto3 error means the object, bucket or multipart upload does not exist."""
    if not isinstance(exc, botocore.exceptions.ClientError):
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    code = str(exc.response.get("Error", {}).get("Code"))
    return status == 404 or code in _NOT_FOUND_CODES


def make_s3_client(
    storage: StorageConfig,
    max_pool_connections: int = 64,
    *,
    read_timeout_s: float = 60.0,
    connect_timeout_s: float = 10.0,
    attempts: int = 1,
    checksums: str = "when_required",
) -> Any:
    """The one boto3 S3 client factory of the package (path-style, SigV4), loader and platform.

    The loader's defaults: many pooled connections for concurrent ranged GETs, botocore's own
    retries off (`ObjectStore` retries whole reads, body included), and checksums computed and
    validated only when required (ranged reads carry no full-object checksum; the loader
    verifies lengths and sha256 itself). The control plane asks for botocore's retries
    (`attempts` in total) and its default checksums (`checksums="when_supported"`).
    """
    config = Config(
        signature_version="s3v4",
        max_pool_connections=max_pool_connections,
        retries={"total_max_attempts": attempts, "mode": "standard"},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        tcp_keepalive=True,
        s3={"addressing_style": "path"},
        request_checksum_calculation=checksums,
        response_checksum_validation=checksums,
    )
    with _SESSION_LOCK:  # one session (its loaded service models) shared, clients made in turn
        return _SESSION.client(
            "s3",
            endpoint_url=storage.endpoint_url,
            **storage.credentials(),
            region_name=storage.region,
            config=config,
        )


def _fill_from_body(body: Any, views: Sequence[memoryview]) -> int:
    """Read a response body into `views` in order; return how many bytes arrived in total."""
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    direct = isinstance(fp, http.client.HTTPResponse) and not fp.chunked
    if direct:
        headers = getattr(raw, "headers", {}) or {}
        direct = headers.get("content-encoding", "identity") in ("identity", "")
    reader: Callable[[memoryview], int] = fp.readinto if direct else body.readinto  # type: ignore[union-attr]  # `direct`: fp is an HTTPResponse
    total = 0
    for view in views:
        filled = 0
        while filled < len(view):
            n = reader(view[filled:])
            if not n:
                return total + filled
            filled += n
        total += filled
    # Anything past the expected length is an error too.
    extra = reader(memoryview(bytearray(1)))
    return total + extra


class ObjectStore:
    """Sizes and ranged reads of objects in one bucket, safe to share across threads."""

    def __init__(
        self,
        storage: StorageConfig,
        *,
        max_pool_connections: int = 64,
        client: Any = None,
    ) -> None:
        self.bucket = storage.bucket
        self.retry: RetryPolicy = storage.retry
        # A boto3 S3 client (or a stand-in with its methods): boto3 ships no types.
        self.client: Any = client or make_s3_client(storage, max_pool_connections)
        self._lock = threading.Lock()
        self.retries = 0
        """Transient failures retried so far (for metrics and tests)."""

    @classmethod
    def over(cls, client: Any, bucket: str) -> ObjectStore:
        """Reads of `bucket` through an existing client (the control plane's)."""
        return cls(StorageConfig(bucket=bucket), client=client)

    def _with_retries(self, what: str, fn: Callable[[], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    if is_not_found(exc):
                        raise ObjectNotFoundError(f"{what} failed: not found") from exc
                    raise ObjectStoreError(f"{what} failed: {exc}") from exc
                if attempt >= self.retry.max_attempts:
                    raise ObjectStoreError(
                        f"{what} failed after {attempt} attempts: {exc}"
                    ) from exc
                with self._lock:
                    self.retries += 1
                delay = self.retry.delay(attempt)
                log.debug("retrying %s after %r (attempt %d, %.3fs)", what, exc, attempt, delay)
                time.sleep(delay)

    def stat(self, key: str) -> ObjectInfo:
        """HEAD an object: its size and any sha256 recorded in its metadata."""

        def call() -> ObjectInfo:
            resp = self.client.head_object(Bucket=self.bucket, Key=key)
            meta = {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}
            sha = meta.get("sha256")
            size, etag = int(resp["ContentLength"]), resp.get("ETag")
            return ObjectInfo(key, size, sha.lower() if sha else None, etag)

        return self._with_retries(f"HEAD {key}", call)

    def head(self, key: str) -> int:
        """The object's size in bytes."""
        return self.stat(key).size

    def find(self, key: str) -> ObjectInfo | None:
        """The object's size and ETag from a listing of its exact key; None when it is absent.

        How an optional file is looked for: S3 answers a GET or HEAD of a missing key with 404
        only to a caller that may list the whole bucket (403 to the others), and our policies
        allow listing only under each role's own prefixes (infra identity module). A key sorts
        before every longer key it prefixes, so the first listed key is the exact one if any.
        """

        def call() -> ObjectInfo | None:
            resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
            for obj in resp.get("Contents") or []:
                if obj.get("Key") == key:
                    return ObjectInfo(key, int(obj["Size"]), None, obj.get("ETag"))
            return None

        return self._with_retries(f"LIST {key}", call)

    def read_prefix(self, key: str, n: int) -> tuple[bytes, ObjectInfo]:
        """The object's first min(n, size) bytes and its info, in one ranged GET (with retries)."""
        if n <= 0:
            return b"", self.stat(key)

        def call() -> tuple[bytes, ObjectInfo] | None:
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{n - 1}")
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                    return None  # an empty object has no byte 0
                raise
            body = resp["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            declared = int(resp.get("ContentLength", -1))
            if len(data) != declared:
                raise ShortReadError(f"asked for {declared} bytes of {key}, got {len(data)}")
            content_range = resp.get("ContentRange") or ""
            total = content_range.rpartition("/")[2]
            size = int(total) if total.isdigit() else declared
            meta = {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}
            sha = meta.get("sha256")
            return data, ObjectInfo(key, size, sha.lower() if sha else None, resp.get("ETag"))

        got = self._with_retries(f"GET {key} bytes=0-{n - 1}", call)
        if got is None:
            return b"", self.stat(key)
        return got

    def get_range_into(self, key: str, start: int, views: Sequence[memoryview]) -> None:
        """Fill `views` (in order) with the object's bytes from `start`, retrying transient errors.

        The range read is [start, start + total length of views); a response of any other
        length is a `ShortReadError` and is retried.
        """
        length = sum(len(v) for v in views)
        if length == 0:
            return
        end = start + length  # exclusive

        def call() -> None:
            resp = self.client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}"
            )
            body = resp["Body"]
            ok = False
            try:
                declared = int(resp.get("ContentLength", -1))
                if declared != length:
                    raise ShortReadError(
                        f"asked for {length} bytes at {start} of {key}, server declared {declared}"
                    )
                got = _fill_from_body(body, views)
                if got != length:
                    raise ShortReadError(f"asked for {length} bytes at {start} of {key}, got {got}")
                ok = True
            finally:
                raw = getattr(body, "_raw_stream", None)
                if not ok:
                    body.close()
                if raw is not None and hasattr(raw, "release_conn"):
                    raw.release_conn()

        self._with_retries(f"GET {key} bytes={start}-{end - 1}", call)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """The object's bytes [start, end) (end exclusive), length verified, with retries."""
        if end < start:
            raise ValueError(f"bad range [{start}, {end})")
        buf = bytearray(end - start)
        self.get_range_into(key, start, [memoryview(buf)])
        return bytes(buf)

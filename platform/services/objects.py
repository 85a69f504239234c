"""Object-storage helpers of the control plane: puts, prefix delete and presigned multipart
uploads, over the loader's S3 stack (`loraplex.loader.object_store`: the client, the test
for a missing object and ranged reads live there, once).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from botocore.exceptions import ClientError

from loraplex.loader.object_store import ObjectStore, is_not_found, make_s3_client
from loraplex.platform.settings import Settings

DELETE_BATCH = 1000
CONTROL_PLANE_ATTEMPTS = 4
"""botocore attempts in total per control-plane call (the loader retries its reads itself)."""


def s3_client(settings: Settings, *, read_timeout_s: float = 60.0) -> Any:
    """The platform's S3 client: the loader's factory with botocore retries and checksums."""
    if not settings.s3_endpoint_url:
        raise RuntimeError("LORAPLEX_S3_ENDPOINT_URL is not set: no object storage configured")
    return make_s3_client(
        settings.storage(),
        10,
        read_timeout_s=read_timeout_s,
        attempts=CONTROL_PLANE_ATTEMPTS,
        checksums="when_supported",
    )


def put_bytes(client: Any, bucket: str, key: str, data: bytes) -> None:
    """Store a small object in one PUT."""
    client.put_object(Bucket=bucket, Key=key, Body=data)


def put_file(client: Any, bucket: str, key: str, fileobj: BinaryIO) -> None:
    """Stream a file-like object to a key (multipart for big files)."""
    fileobj.seek(0)
    client.upload_fileobj(fileobj, bucket, key)


class _HashingReader:
    """A read-only, non-seekable view of a file that hashes its bytes as boto3 reads them
    (non-seekable: boto3 then reads it once, in order)."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._f = fileobj
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, amount: int = -1) -> bytes:
        data = self._f.read(amount)
        self.size += len(data)
        self.digest.update(data)
        return data


def put_file_hashed(client: Any, bucket: str, key: str, fileobj: BinaryIO) -> tuple[str, int]:
    """`put_file` that also returns the sha256 and size of what it sent, computed on the way
    (the file is read once: the hash costs no second pass over it)."""
    fileobj.seek(0)
    reader = _HashingReader(fileobj)
    client.upload_fileobj(reader, bucket, key)
    return reader.digest.hexdigest(), reader.size


def object_size(client: Any, bucket: str, key: str) -> int | None:
    """The object's size in bytes, or None when it does not exist (from a listing of the exact
    key: a GET or HEAD of a missing key is a 403, not a 404, under our IAM policies)."""
    info = ObjectStore.over(client, bucket).find(key)
    return None if info is None else info.size


def read_range(client: Any, bucket: str, key: str, start: int, length: int) -> bytes:
    """Bytes [start, start+length) of an object (the loader's verified, retried ranged GET)."""
    if length <= 0:
        return b""
    return ObjectStore.over(client, bucket).get_range(key, start, start + length)


def read_all(client: Any, bucket: str, key: str, max_bytes: int) -> bytes:
    """A small object's bytes; refuses (ValueError) an object over `max_bytes`."""
    size = object_size(client, bucket, key)
    if size is None:
        raise FileNotFoundError(key)
    if size > max_bytes:
        raise ValueError(f"{key} is {size} bytes, over the limit of {max_bytes}")
    return read_range(client, bucket, key, 0, size) if size else b""


def iter_chunks(client: Any, bucket: str, key: str, chunk: int = 8 << 20) -> Iterator[bytes]:
    """Stream an object's bytes in chunks (bounded memory)."""
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        yield from body.iter_chunks(chunk)
    finally:
        body.close()


def sha256_of(client: Any, bucket: str, key: str, on_chunk: Any = None) -> tuple[str, int]:
    """Streamed sha256 hex digest and byte count of an object; `on_chunk()` runs per chunk."""
    digest = hashlib.sha256()
    total = 0
    for part in iter_chunks(client, bucket, key):
        digest.update(part)
        total += len(part)
        if on_chunk is not None:
            on_chunk()
    return digest.hexdigest(), total


def list_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    """Every key under `prefix`."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [obj["Key"] for obj in page.get("Contents", [])]
    return keys


def abort_multipart_uploads(client: Any, bucket: str, prefix: str) -> int:
    """Abort unfinished multipart uploads under `prefix`; returns how many."""
    count = 0
    try:
        resp = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    except ClientError:
        return 0
    for upload in resp.get("Uploads", []) or []:
        try:
            client.abort_multipart_upload(
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            count += 1
        except ClientError as exc:
            if not is_not_found(exc):
                raise
    return count


def delete_prefix(client: Any, bucket: str, prefix: str) -> int:
    """Delete every object under `prefix` (and abort its unfinished uploads); returns the count."""
    if not prefix or not prefix.endswith("/"):
        raise ValueError(f"refusing to delete under {prefix!r}: a prefix must end with '/'")
    abort_multipart_uploads(client, bucket, prefix)
    keys = list_keys(client, bucket, prefix)
    for i in range(0, len(keys), DELETE_BATCH):
        batch = [{"Key": k} for k in keys[i : i + DELETE_BATCH]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
    return len(keys)


def start_multipart(client: Any, bucket: str, key: str) -> str:
    """Begin a multipart upload; returns its upload id."""
    return str(client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])


def presign_parts(
    client: Any, bucket: str, key: str, upload_id: str, sizes: list[int], expiry_s: int
) -> list[dict[str, Any]]:
    """Presigned PUT URLs for parts 1..len(sizes) of a multipart upload; each URL signs its
    part's Content-Length (a PUT of any other size is refused by the store's signature check)."""
    return [
        {
            "part_number": n,
            "size": size,
            "url": client.generate_presigned_url(
                "upload_part",
                Params={
                    "Bucket": bucket,
                    "Key": key,
                    "UploadId": upload_id,
                    "PartNumber": n,
                    "ContentLength": size,
                },
                ExpiresIn=expiry_s,
            ),
        }
        for n, size in enumerate(sizes, start=1)
    ]


def complete_multipart(
    client: Any, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]]
) -> None:
    """Finish a multipart upload from (part number, ETag) pairs."""
    client.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in sorted(parts)]},
    )


def abort_multipart(client: Any, bucket: str, key: str, upload_id: str) -> None:
    """Abandon one multipart upload (its parts are discarded)."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except ClientError as exc:
        if not is_not_found(exc):
            raise

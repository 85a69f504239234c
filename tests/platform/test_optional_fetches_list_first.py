"""Every fetch of a file that may be absent looks for it by listing its exact key, never by a
GET or HEAD that comes back 404 (issue 21 item 8).

S3 answers a GET or HEAD of a missing key with 404 only to a caller allowed s3:ListBucket
without a prefix condition, and with 403 AccessDenied to everyone else ("If the object you
request doesn't exist, the error that Amazon S3 returns depends on whether you also have the
s3:ListBucket permission", GetObject and HeadObject in the Amazon S3 API Reference). Our IAM
policies (infra/terraform/modules/identity) allow listing only under each role's exact
prefixes, so code that waits for the 404 would read the 403 as a failure. Against the real
S3 server (SeaweedFS), each optional fetch runs on a missing file while botocore's after-call
hook records every GetObject/HeadObject answered 404.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loraplex.loader.checkpoint_index import SINGLE_NAME, resolve_checkpoint
from loraplex.loader.object_store import ObjectStore, make_s3_client
from loraplex.platform.engine.model_source import S3ModelSource
from loraplex.platform.gateway.service import fetch_model_assets
from loraplex.platform.services import objects

READS = {"GetObject", "HeadObject"}


class Missing404s:
    """Records each GET/HEAD of a client that the server answered 404."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, int]] = []

    def watch(self, client: Any) -> Any:
        client.meta.events.register("after-call.s3", self._after)
        return client

    def _after(self, http_response: Any, model: Any, **_: Any) -> None:
        if model.name in READS and http_response.status_code == 404:
            self.hits.append((model.name, http_response.status_code))


@pytest.fixture
def spy() -> Missing404s:
    return Missing404s()


def test_gateway_model_assets_skip_missing_files_by_listing(
    spy, s3_storage, s3_client, s3_bucket, s3_prefix, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "config.json", Body=b"{}")
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "tokenizer.json", Body=b'{"x": 1}')
    client = spy.watch(make_s3_client(s3_storage))
    dest = fetch_model_assets(client, s3_bucket, s3_prefix, tmp_path / "assets")
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "tokenizer.json",
    ]
    assert (dest / "tokenizer.json").read_bytes() == b'{"x": 1}'
    assert spy.hits == []


def test_checkpoint_without_index_is_found_by_listing(
    spy, s3_storage, s3_client, s3_bucket, s3_prefix
) -> None:
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + SINGLE_NAME, Body=b"x" * 16)
    store = ObjectStore(s3_storage, client=spy.watch(make_s3_client(s3_storage)))
    files = resolve_checkpoint(store, s3_prefix)
    assert files.keys == (s3_prefix + SINGLE_NAME,) and files.weight_map is None
    assert spy.hits == []


def test_control_plane_size_of_a_missing_object_is_listed(
    spy, s3_storage, s3_bucket, s3_prefix
) -> None:
    client = spy.watch(make_s3_client(s3_storage))
    client.put_object(Bucket=s3_bucket, Key=s3_prefix + "present.bin", Body=b"abc")
    # A longer key sharing the prefix must not be taken for the missing one.
    client.put_object(Bucket=s3_bucket, Key=s3_prefix + "gone.bin.partial", Body=b"abcd")
    assert objects.object_size(client, s3_bucket, s3_prefix + "present.bin") == 3
    assert objects.object_size(client, s3_bucket, s3_prefix + "gone.bin") is None
    with pytest.raises(FileNotFoundError):
        objects.read_all(client, s3_bucket, s3_prefix + "gone.bin", 1024)
    assert spy.hits == []


def test_engine_optional_model_files_are_listed(
    spy, s3_storage, s3_client, s3_bucket, s3_prefix
) -> None:
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "config.json", Body=json.dumps({"a": 1}).encode()
    )
    from loraplex.loader.timeline import Timeline

    source = S3ModelSource(f"s3://{s3_bucket}/{s3_prefix}", s3_storage, Timeline())
    spy.watch(source.loader.store.client)
    assert source.read_config() == {"a": 1}
    assert source._small_file("generation_config.json") is None
    assert spy.hits == []

"""Adapter versions from the real S3: `ObjectSource` (the one adapter fetch) returns both files
only when they match the version's identity, and refuses oversized objects."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import save

from loraplex.adapters.peft_format import AdapterFormatError
from loraplex.loader.object_store import ObjectStore
from loraplex.platform.engine.lora.sources import AdapterRef, ObjectSource
from loraplex.platform.engine_spec.config import engine_default

LIMIT = engine_default("adapter_max_bytes")


def _weights() -> bytes:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for i in range(2):
        p = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        out[f"{p}.lora_A.weight"] = torch.randn(8, 64, generator=gen)
        out[f"{p}.lora_B.weight"] = torch.randn(64, 8, generator=gen)
    return save(out)


@pytest.fixture
def stored(s3_storage, s3_client, s3_bucket, s3_prefix) -> tuple[ObjectStore, bytes, bytes]:
    cfg, weights = json.dumps({"r": 8, "lora_alpha": 16}).encode(), _weights()
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "adapter_config.json", Body=cfg)
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "adapter_model.safetensors", Body=weights
    )
    return ObjectStore(s3_storage), cfg, weights


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_returns_both_files_checked(stored, s3_prefix) -> None:
    store, cfg, weights = stored
    ref = AdapterRef(object_prefix=s3_prefix, sha256=_sha(weights), config_sha256=_sha(cfg))
    assert ObjectSource(ref, store, LIMIT).fetch() == (cfg, weights)


def test_other_bytes_are_never_served_under_a_version(stored, s3_prefix) -> None:
    store, cfg, weights = stored
    with pytest.raises(AdapterFormatError, match="does not match version sha256"):
        ObjectSource(AdapterRef(object_prefix=s3_prefix, sha256=_sha(b"x")), store, LIMIT).fetch()
    with pytest.raises(AdapterFormatError, match="config sha256"):
        ObjectSource(
            AdapterRef(object_prefix=s3_prefix, sha256=_sha(weights), config_sha256=_sha(b"{}")),
            store,
            LIMIT,
        ).fetch()


def test_oversized_objects_are_refused_before_reading(stored, s3_prefix) -> None:
    store, _, weights = stored
    source = ObjectSource(
        AdapterRef(object_prefix=s3_prefix, sha256=_sha(weights)), store, max_bytes=1000
    )
    with pytest.raises(AdapterFormatError, match="over this engine.s adapter_max_bytes=1000"):
        source.fetch()


def test_source_map_falls_back_to_another_tenants_copy(
    stored, s3_client, s3_bucket, s3_prefix
) -> None:
    """The most recently requested copy is gone: the fetch takes the other tenant's copy of
    the same bytes, and tries that one first from then on."""
    from loraplex.platform.engine.lora.source_map import SourceMap

    store, cfg, weights = stored
    other = s3_prefix + "other-tenant/"
    for name, body in (("adapter_config.json", cfg), ("adapter_model.safetensors", weights)):
        s3_client.put_object(Bucket=s3_bucket, Key=other + name, Body=body)
    targets = {"modules": []}
    kept = ObjectSource(
        AdapterRef(
            object_prefix=other,
            sha256=_sha(weights),
            config_sha256=_sha(cfg),
            tenant="t2",
            targets=targets,
        ),
        store,
        LIMIT,
    )
    gone = ObjectSource(
        AdapterRef(
            object_prefix=s3_prefix,
            sha256=_sha(weights),
            config_sha256=_sha(cfg),
            tenant="t1",
            targets=targets,
        ),
        store,
        LIMIT,
    )
    sources = SourceMap()
    sources.add(kept)
    sources.add(gone)
    sources.add(gone)  # the same copy again is one entry
    assert sources.copies(kept.key) == [gone, kept]
    s3_client.delete_object(Bucket=s3_bucket, Key=s3_prefix + "adapter_model.safetensors")
    source, got_cfg, got_weights = sources.fetch(kept.key)
    assert source is kept and (got_cfg, got_weights) == (cfg, weights)
    assert sources.copies(kept.key) == [kept, gone]
    s3_client.delete_object(Bucket=s3_bucket, Key=other + "adapter_model.safetensors")
    with pytest.raises(Exception, match="not found"):
        sources.fetch(kept.key)

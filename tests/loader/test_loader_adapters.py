"""Adapter weights from the real S3 into host tensors through the streaming reader."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load, save

from loraplex.loader.adapters import (
    AdapterTooLargeError,
    load_adapter_config,
    load_adapter_tensors,
)
from loraplex.loader.object_store import ObjectStore
from loraplex.loader.safetensors_header import SafetensorsError
from loraplex.loader.stream_reader import ChecksumMismatchError
from loraplex.platform.settings import Settings


def _adapter() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    out = {}
    for i in range(3):
        for proj in ("q_proj", "v_proj"):
            p = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            out[f"{p}.lora_A.weight"] = torch.randn(8, 64)
            out[f"{p}.lora_B.weight"] = torch.randn(64, 8)
    return out


@pytest.fixture
def store(s3_endpoint: str, s3_bucket: str) -> ObjectStore:
    return ObjectStore(Settings(s3_endpoint_url=s3_endpoint, s3_bucket=s3_bucket))


def test_adapter_loads_into_host_tensors(store, s3_client, s3_bucket, s3_prefix) -> None:
    blob = save(_adapter())
    cfg = json.dumps({"r": 8, "lora_alpha": 16}).encode()
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "adapter_model.safetensors", Body=blob)
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "adapter_config.json", Body=cfg)
    got = load_adapter_tensors(store, s3_prefix, hashlib.sha256(blob).hexdigest())
    ref = load(blob)
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) and got[k].device.type == "cpu" for k in ref)
    assert load_adapter_config(store, s3_prefix) == cfg


def test_adapter_checks_sha256_size_and_format(store, s3_client, s3_bucket, s3_prefix) -> None:
    blob = save(_adapter())
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "adapter_model.safetensors", Body=blob)
    with pytest.raises(ChecksumMismatchError):
        load_adapter_tensors(store, s3_prefix, hashlib.sha256(b"x").hexdigest())
    with pytest.raises(AdapterTooLargeError):
        load_adapter_tensors(store, s3_prefix, None, max_bytes=1000)
    pickle_like = b"\x80\x04\x95" + bytes(200)
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "p/adapter_model.safetensors", Body=pickle_like
    )
    with pytest.raises(SafetensorsError):
        load_adapter_tensors(store, s3_prefix + "p/", None)

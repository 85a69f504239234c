"""Load a PEFT adapter's weights from object storage into host tensors, for the adapter host tier.

The same streaming reader as for base models: the header is validated before any weight is
allocated, the size is capped, and the bytes must hash to the version's recorded sha256.
The result is a plain `{name: tensor}` dict on CPU, ready for the host cache.
"""

from __future__ import annotations

import torch

from loraplex.loader.object_store import ObjectStore
from loraplex.loader.range_plan import MIB
from loraplex.loader.stream_reader import StreamConfig, StreamLoader

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"

ADAPTER_STREAM = StreamConfig(chunk_bytes=4 * MIB, concurrency=4, header_probe_bytes=64 * 1024)
"""Adapters are small (MBs): smaller ranges keep several GETs in flight for one file."""


class AdapterTooLargeError(ValueError):
    """The adapter's weights file is bigger than the deployment allows."""


def load_adapter_tensors(
    store: ObjectStore,
    object_prefix: str,
    sha256: str | None,
    *,
    max_bytes: int = 512 * MIB,
    max_header_bytes: int = 16 * MIB,
    config: StreamConfig | None = None,
) -> dict[str, torch.Tensor]:
    """`{object_prefix}adapter_model.safetensors` as CPU tensors, size- and sha256-checked.

    `sha256` is the version's recorded digest of the weights file; None skips the check
    (only for adapters that never went through validation).
    """
    key = object_prefix + ADAPTER_WEIGHTS
    base = config or ADAPTER_STREAM
    cfg = StreamConfig(
        chunk_bytes=base.chunk_bytes,
        concurrency=base.concurrency,
        window_bytes=base.window_bytes,
        header_probe_bytes=base.header_probe_bytes,
        max_header_bytes=min(base.max_header_bytes, max_header_bytes),
        verify_sha256=True,
        progress=False,
    )
    loader = StreamLoader(store, cfg)
    plan = loader.plan(key, expected_sha256={key: sha256} if sha256 else None)
    size = plan.shards[0].info.size
    if size > max_bytes:
        raise AdapterTooLargeError(f"{key} is {size} bytes, over the limit of {max_bytes}")
    return loader.load(plan)


def load_adapter_config(
    store: ObjectStore, object_prefix: str, max_bytes: int = 64 * 1024
) -> bytes:
    """The raw `adapter_config.json` bytes (size-capped); parsing is the adapters package's job."""
    key = object_prefix + ADAPTER_CONFIG
    raw, info = store.read_prefix(key, max_bytes + 1)
    if info.size > max_bytes:
        raise AdapterTooLargeError(f"{key} is {info.size} bytes, over the limit of {max_bytes}")
    return raw

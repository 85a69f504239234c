"""Find a checkpoint's safetensors files in object storage and check the shard index.

A location is a `.safetensors` key, a `model.safetensors.index.json` key, or a folder prefix
holding one of them (the index wins). The index maps each tensor name to its shard file; once
the shard headers are read, every tensor must be in exactly the shard the index names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loraplex.loader.object_store import ObjectNotFoundError, ObjectReader

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_INDEX_BYTES = 64 * 1024 * 1024


class CheckpointLayoutError(ValueError):
    """The checkpoint's files or index are inconsistent or malformed."""


@dataclass(frozen=True)
class CheckpointFiles:
    """The shard keys to read, in order, and the index's weight map (None for one file)."""

    keys: tuple[str, ...]
    weight_map: dict[str, str] | None = None


def parse_index(raw: bytes, index_key: str) -> CheckpointFiles:
    """Validate a `model.safetensors.index.json` and list its shard keys (next to the index)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CheckpointLayoutError(f"{index_key}: not valid JSON ({exc})") from None
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointLayoutError(f"{index_key}: needs a non-empty 'weight_map' object")
    folder = index_key.rpartition("/")[0]
    shards: list[str] = []
    for name, filename in weight_map.items():
        if not isinstance(filename, str) or not filename.endswith(".safetensors"):
            raise CheckpointLayoutError(
                f"{index_key}: tensor {name!r} maps to {filename!r}, not a .safetensors file"
            )
        if "/" in filename or "\\" in filename or filename.startswith("."):
            raise CheckpointLayoutError(
                f"{index_key}: shard name {filename!r} must be a plain file name"
            )
        if filename not in shards:
            shards.append(filename)
    keys = tuple(f"{folder}/{f}" if folder else f for f in sorted(shards))
    return CheckpointFiles(keys, {k: str(v) for k, v in weight_map.items()})


def resolve_checkpoint(store: ObjectReader, location: str) -> CheckpointFiles:
    """The safetensors keys a location stands for (see the module docstring)."""
    if location.endswith(".safetensors"):
        return CheckpointFiles((location,))
    if location.endswith(".json"):
        return _read_index(store, location)
    # Both files are optional: each is looked for by listing its exact key (`find`), since a
    # GET of a missing key is a 403, not a 404, under the platform's IAM policies.
    prefix = location.rstrip("/")
    index_key = f"{prefix}/{INDEX_NAME}" if prefix else INDEX_NAME
    if store.find(index_key) is not None:
        return _read_index(store, index_key)
    single = f"{prefix}/{SINGLE_NAME}" if prefix else SINGLE_NAME
    if store.find(single) is None:
        raise ObjectNotFoundError(f"no {INDEX_NAME} or {SINGLE_NAME} under {location!r}")
    return CheckpointFiles((single,))


def _read_index(store: ObjectReader, key: str) -> CheckpointFiles:
    raw, info = store.read_prefix(key, MAX_INDEX_BYTES + 1)
    if info.size > MAX_INDEX_BYTES:
        raise CheckpointLayoutError(f"{key}: index is {info.size} bytes, over {MAX_INDEX_BYTES}")
    return parse_index(raw, key)


def check_against_index(
    files: CheckpointFiles, shard_tensors: Sequence[tuple[str, Sequence[str]]]
) -> None:
    """Each tensor is in exactly one shard, and in the shard the index (if any) names."""
    seen: dict[str, str] = {}
    for key, names in shard_tensors:
        for name in names:
            if name in seen:
                raise CheckpointLayoutError(f"tensor {name!r} is in both {seen[name]} and {key}")
            seen[name] = key
    if files.weight_map is None:
        return
    wm: Mapping[str, str] = files.weight_map
    for name, key in seen.items():
        listed = wm.get(name)
        if listed is None:
            raise CheckpointLayoutError(f"tensor {name!r} in {key} is not listed in the index")
        if key.rpartition("/")[2] != listed:
            raise CheckpointLayoutError(f"index puts {name!r} in {listed} but it is in {key}")
    missing = [n for n in wm if n not in seen]
    if missing:
        raise CheckpointLayoutError(
            f"index lists {len(missing)} tensor(s) no shard holds, e.g. {missing[:3]}"
        )

"""The cache identity of an adapter version, torch-free so the gateway and the engine share it.

An adapter's outputs depend on its config (`lora_alpha`, `use_rslora`, ...) as well as its
weights, so the identity folds both digests: two versions with equal weights but another
config never share a host-tier entry, a device slot or prefix-cache blocks.
"""

from __future__ import annotations

import hashlib


def adapter_ref_key(weights_sha256: str, config_sha256: str | None) -> str:
    """The engine-wide key of a version from its weights' and (optional) config's sha256."""
    if config_sha256 is None:
        return weights_sha256.lower()
    joined = f"{weights_sha256.lower()}:{config_sha256.lower()}"
    return hashlib.sha256(joined.encode()).hexdigest()

"""The KV block hashes of the prefix cache: one definition for the replica and the router.

Block i of a sequence is keyed by sha256(key of block i-1 || token ids of block i); the key of
the empty prefix folds in the model id, the adapter version's identity and the cache salt, so
two adapters, two versions or two tenants never map to the same blocks. Every key commits to
its whole prefix, so a cached prefix is the leading run of keys found.

The replica's `KVCacheManager` keys its blocks with these functions and looks up at most
`max_cached_blocks` of them; the gateway's router hashes a prompt the same way, with the
`model_id` and `block_size` each replica reports in `/state`, to predict exactly how many of
its tokens that replica can serve from cache.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def root_hash(model_id: str, adapter_key: str | None, cache_salt: str | None) -> bytes:
    """Key of the empty prefix for one (model, adapter version, salt)."""
    h = hashlib.sha256(b"loraplex-kv-v1\0")
    for part in (model_id, adapter_key, cache_salt):
        h.update(b"\1" if part is None else b"\2" + part.encode() + b"\0")
    return h.digest()


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Key of a full block given its parent's key and its tokens."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    model_id: str,
    adapter_key: str | None,
    cache_salt: str | None,
) -> list[bytes]:
    """Chained keys of every full block of `token_ids`."""
    parent = root_hash(model_id, adapter_key, cache_salt)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out


def max_cached_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """How many leading blocks a prompt may take from the cache: at least one token is always
    computed (its logits are needed), so a prompt of exactly k blocks reuses k - 1."""
    return max(num_prompt_tokens - 1, 0) // block_size

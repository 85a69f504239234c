"""The router's block keys are the replica's: `wire.prefix_hash.block_hashes` gives exactly the
keys the engine's KV cache manager registers, and `max_cached_blocks` is its lookup limit."""

from __future__ import annotations

from loraplex.platform.engine.block_pool import BlockPool
from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.wire.prefix_hash import block_hashes, max_cached_blocks


def test_router_keys_equal_the_engines() -> None:
    ids = list(range(100, 137))
    for bs in (4, 16):
        kv = KVCacheManager(BlockPool(64), bs, "model-x")
        req = Request("r", ids, SamplingParams(max_tokens=2), adapter_key="ad", cache_salt="s")
        assert block_hashes(ids, bs, "model-x", "ad", "s") == kv.block_hashes(req)
    assert block_hashes(ids, 4, "model-x", "ad", "s") != block_hashes(ids, 4, "model-y", "ad", "s")


def test_cached_prefix_limit_matches_the_engine() -> None:
    bs = 4
    kv = KVCacheManager(BlockPool(64), bs, "m")
    for n in (1, 4, 5, 8, 9, 13):
        first = Request(f"a{n}", list(range(n)), SamplingParams(max_tokens=2))
        computed, cached = kv.get_computed_blocks(first)
        assert kv.allocate_slots(first, n - cached, computed)
        first.num_computed_tokens = n
        kv.free(first)
        again = Request(f"b{n}", list(range(n)), SamplingParams(max_tokens=2))
        assert kv.get_computed_blocks(again)[1] == max_cached_blocks(n, bs) * bs

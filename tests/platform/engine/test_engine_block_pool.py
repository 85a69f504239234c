"""BlockPool: reference counts, the LRU free queue, and eviction of cached blocks."""

from __future__ import annotations

import pytest

from loraplex.platform.engine.block_pool import BlockPool


def test_allocate_and_free_round_trip() -> None:
    pool = BlockPool(8)
    blocks = pool.allocate(5)
    assert [b.ref_cnt for b in blocks] == [1] * 5
    assert pool.num_free_blocks == 3
    assert pool.usage() == pytest.approx(5 / 8)
    pool.free(blocks)
    assert pool.num_free_blocks == 8
    assert pool.usage() == 0.0


def test_over_allocation_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(RuntimeError, match="only 1 free"):
        pool.allocate(2)
    assert pool.num_free_blocks == 1


def test_double_free_is_an_error() -> None:
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.free([block])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([block])


def test_shared_block_returns_to_queue_only_when_last_reference_drops() -> None:
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free([block])
    assert pool.num_free_blocks == 3
    pool.free([block])
    assert pool.num_free_blocks == 4


def test_cached_free_block_can_be_touched_back() -> None:
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.cache_block(block, b"h1")
    pool.free([block])
    assert pool.lookup(b"h1") is block
    pool.touch([block])
    assert block.ref_cnt == 1 and pool.num_free_blocks == 3
    pool.free([block])


def test_lru_eviction_takes_least_recently_freed_first() -> None:
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    for blk, h in ((a, b"a"), (b, b"b"), (c, b"c")):
        pool.cache_block(blk, h)
    pool.free([b])
    pool.free([a])
    pool.free([c])
    (first,) = pool.allocate(1)
    assert first is b
    assert pool.lookup(b"b") is None
    assert pool.lookup(b"a") is a and pool.lookup(b"c") is c
    assert pool.num_evictions == 1


def test_duplicate_hash_keeps_the_first_block() -> None:
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache_block(a, b"x")
    pool.cache_block(b, b"x")
    assert pool.lookup(b"x") is a
    assert b.block_hash is None


def test_caching_disabled_indexes_nothing() -> None:
    pool = BlockPool(2, enable_caching=False)
    (a,) = pool.allocate(1)
    pool.cache_block(a, b"x")
    assert pool.lookup(b"x") is None


def test_reset_prefix_cache_only_when_idle() -> None:
    pool = BlockPool(2)
    (a,) = pool.allocate(1)
    pool.cache_block(a, b"x")
    assert not pool.reset_prefix_cache()
    pool.free([a])
    assert pool.reset_prefix_cache()
    assert pool.lookup(b"x") is None and pool.num_cached_blocks == 0

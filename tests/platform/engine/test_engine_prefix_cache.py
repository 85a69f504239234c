"""Prefix cache: chained hashes, longest-prefix lookup, isolation by adapter/salt, counters."""

from __future__ import annotations

from loraplex.platform.engine.block_pool import BlockPool
from loraplex.platform.engine.prefix_cache import KVCacheManager
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.wire.prefix_hash import hash_block, root_hash

BS = 4


def make(rid: str, tokens: list[int], **kw: object) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=4), **kw)


def fill(kv: KVCacheManager, req: Request) -> None:
    """Admit a request the way the scheduler does and mark its prompt computed."""
    computed, n_cached = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - n_cached, computed)
    req.num_computed_tokens = req.num_tokens


def test_root_hash_separates_model_adapter_and_salt() -> None:
    keys = {
        root_hash("m", None, None),
        root_hash("m2", None, None),
        root_hash("m", "a" * 64, None),
        root_hash("m", "b" * 64, None),
        root_hash("m", None, "tenant-1"),
        root_hash("m", None, "tenant-2"),
        root_hash("m", "", None),
    }
    assert len(keys) == 7


def test_hash_chain_commits_to_whole_prefix() -> None:
    r = root_hash("m", None, None)
    a = hash_block(hash_block(r, [1, 2]), [3, 4])
    b = hash_block(hash_block(r, [9, 2]), [3, 4])
    assert a != b


def test_longest_prefix_hit_and_counters() -> None:
    kv = KVCacheManager(BlockPool(32), BS, "m")
    first = make("a", list(range(10)))  # blocks [0-3], [4-7] full
    fill(kv, first)
    kv.free(first)
    same = make("b", list(range(10)))
    blocks, n = kv.get_computed_blocks(same)
    assert n == 8 and len(blocks) == 2
    diverging = make("c", [0, 1, 2, 3, 99, 5, 6, 7, 8])
    assert kv.get_computed_blocks(diverging)[1] == 4
    kv.record_lookup(10, 8)
    assert (kv.queries, kv.hits) == (10, 8)


def test_full_prompt_hit_leaves_one_token_to_compute() -> None:
    kv = KVCacheManager(BlockPool(32), BS, "m")
    fill(kv, make("a", list(range(8))))
    blocks, n = kv.get_computed_blocks(make("b", list(range(8))))
    assert n == 4  # the last block is recomputed so its final token yields logits


def test_adapter_and_salt_never_share_blocks() -> None:
    kv = KVCacheManager(BlockPool(64), BS, "m")
    prompt = list(range(12))
    variants = [
        {},
        {"adapter_key": "a" * 64},
        {"adapter_key": "b" * 64},
        {"cache_salt": "t1"},
        {"cache_salt": "t2"},
        {"adapter_key": "a" * 64, "cache_salt": "t1"},
    ]
    reqs = []
    for i, kw in enumerate(variants):
        req = make(f"r{i}", prompt, **kw)
        assert kv.get_computed_blocks(req)[1] == 0
        fill(kv, req)
        reqs.append(req)
    all_ids = [b for r in reqs for b in r.block_ids]
    assert len(all_ids) == len(set(all_ids))
    for i, kw in enumerate(variants):  # each variant hits only its own blocks
        again = make(f"again{i}", prompt, **kw)
        blocks, n = kv.get_computed_blocks(again)
        assert n == 8
        assert {b.block_id for b in blocks} <= set(reqs[i].block_ids)


def test_prompt_logprobs_requests_skip_lookup() -> None:
    kv = KVCacheManager(BlockPool(32), BS, "m")
    fill(kv, make("a", list(range(10))))
    req = Request("b", list(range(10)), SamplingParams(prompt_logprobs=1))
    assert kv.get_computed_blocks(req) == ([], 0)


def test_allocation_failure_changes_nothing() -> None:
    pool = BlockPool(3)
    kv = KVCacheManager(pool, BS, "m")
    req = make("a", list(range(13)))  # needs 4 blocks
    assert not kv.allocate_slots(req, 13)
    assert pool.num_free_blocks == 3 and req.block_ids == [] and kv.num_requests() == 0


def test_evicted_prefix_misses() -> None:
    pool = BlockPool(3)
    kv = KVCacheManager(pool, BS, "m")
    a = make("a", list(range(9)))
    fill(kv, a)
    kv.free(a)
    other = make("b", list(range(100, 109)))
    fill(kv, other)  # takes all 3 blocks, evicting a's
    assert kv.get_computed_blocks(make("c", list(range(9))))[1] == 0


def test_shared_blocks_are_reference_counted() -> None:
    pool = BlockPool(8)
    kv = KVCacheManager(pool, BS, "m")
    a, b = make("a", list(range(9))), make("b", list(range(9)))
    fill(kv, a)
    fill(kv, b)
    assert a.block_ids[:2] == b.block_ids[:2] and a.block_ids[2] != b.block_ids[2]
    assert pool.num_free_blocks == 8 - 4
    kv.free(a)
    assert pool.num_free_blocks == 8 - 3
    kv.free(b)
    assert pool.num_free_blocks == 8

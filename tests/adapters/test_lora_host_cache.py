"""Host-memory adapter tier: LRU bounded in bytes, keyed by version sha256."""

from __future__ import annotations

import threading

import pytest
from support.lora_reference import random_adapter

from loraplex.adapters.host_cache import AdapterTooLargeError, HostCache


def test_lru_bounded_in_bytes():
    ads = [random_adapter(f"sha-{i}", {"q_proj": 8}, seed=i, num_layers=1) for i in range(4)]
    size = ads[0].nbytes
    assert size == (8 * 64 + 64 * 8) * 4
    cache = HostCache(capacity_bytes=3 * size)
    for a in ads[:3]:
        assert cache.put(a) == []
    assert cache.used_bytes == 3 * size
    assert cache.get("sha-0") is ads[0]  # now most recently used
    assert cache.put(ads[3]) == ["sha-1"]  # the LRU entry goes
    assert cache.keys() == ["sha-2", "sha-0", "sha-3"]
    assert cache.get("sha-1") is None
    assert cache.used_bytes <= cache.capacity_bytes
    assert cache.stats.evictions == 1 and cache.stats.misses == 1 and cache.stats.hits == 1


def test_mixed_sizes_evict_until_it_fits():
    small = [random_adapter(f"s{i}", {"q_proj": 4}, seed=i, num_layers=1) for i in range(4)]
    big = random_adapter("big", {"q_proj": 16}, seed=9, num_layers=1)
    cache = HostCache(capacity_bytes=4 * small[0].nbytes)
    for a in small:
        cache.put(a)
    evicted = cache.put(big)
    assert evicted == ["s0", "s1", "s2", "s3"]
    assert cache.keys() == ["big"]


def test_versions_are_separate_entries():
    v1 = random_adapter("sha-v1", {"q_proj": 4}, seed=1, num_layers=1)
    v2 = random_adapter("sha-v2", {"q_proj": 4}, seed=2, num_layers=1)
    cache = HostCache(capacity_bytes=1 << 20)
    cache.put(v1)
    cache.put(v2)
    assert cache.get("sha-v1") is v1 and cache.get("sha-v2") is v2
    cache.put(v1)  # refresh, not duplicate
    assert len(cache) == 2 and cache.used_bytes == v1.nbytes + v2.nbytes
    assert cache.discard("sha-v1") and not cache.discard("sha-v1")
    assert cache.used_bytes == v2.nbytes


def test_too_large_and_bad_capacity():
    a = random_adapter("x", {"q_proj": 8}, seed=0, num_layers=1)
    with pytest.raises(AdapterTooLargeError):
        HostCache(capacity_bytes=a.nbytes - 1).put(a)
    with pytest.raises(ValueError):
        HostCache(0)


def test_concurrent_puts_keep_the_bound():
    ads = [random_adapter(f"k{i}", {"q_proj": 4}, seed=i, num_layers=1) for i in range(40)]
    cache = HostCache(capacity_bytes=5 * ads[0].nbytes)

    def worker(chunk):
        for a in chunk:
            cache.put(a)
            cache.get(a.key)

    threads = [threading.Thread(target=worker, args=(ads[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 5 and cache.used_bytes == 5 * ads[0].nbytes

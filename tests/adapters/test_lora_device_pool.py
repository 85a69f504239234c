"""Device adapter pool: memory follows each adapter's rank, LRU among unused, pins, refs,
compaction keeps weights intact."""

from __future__ import annotations

import pytest
import torch
from support.lora_reference import llama_specs, random_adapter, reference_delta

from loraplex.adapters.device_pool import AdapterPoolFullError, DevicePool
from loraplex.adapters.kernels.lora_torch import lora_delta_torch
from loraplex.adapters.metadata import build_lora_meta

SPECS = llama_specs(num_layers=2)
ROW = DevicePool.bytes_per_row(SPECS, torch.float32)


def pool_of(rows: int, max_rank: int = 32) -> DevicePool:
    return DevicePool(SPECS, capacity_bytes=rows * ROW + ROW // 2, max_lora_rank=max_rank)


def ad(key, rank, seed=0):
    return random_adapter(key, {"q_proj": rank, "down_proj": rank}, seed=seed)


def test_rank8_costs_eight_rows_not_a_max_rank_slot():
    pool = pool_of(64, max_rank=64)
    assert pool.num_rows == 64 and pool.capacity_bytes == 64 * ROW
    for i in range(8):
        pool.load(ad(f"r8-{i}", 8, i))
    assert len(pool.keys()) == 8  # eight rank-8 adapters fit where one rank-64 would
    assert pool.used_bytes == 64 * ROW and pool.get("r8-0").nbytes == 8 * ROW
    pool.load(ad("r64", 64))  # needs everything: evicts all eight (none referenced)
    assert pool.keys() == ["r64"] and pool.stats.evictions == 8


def test_lru_skips_referenced():
    pool = pool_of(48)
    for k in ("a", "b", "c"):
        pool.load(ad(k, 16))
    pool.acquire("a")  # running requests use a and b
    pool.acquire("b")
    pool.load(ad("d", 16))  # must evict c, the only unused one
    assert set(pool.keys()) == {"a", "b", "d"}
    pool.acquire("d")
    with pytest.raises(AdapterPoolFullError):
        pool.load(ad("e", 16))
    assert not pool.can_hold(16)
    pool.release("d")
    assert pool.can_hold(16)
    pool.load(ad("e", 16))
    assert set(pool.keys()) == {"a", "b", "e"}
    with pytest.raises(RuntimeError):
        pool.evict("a")
    with pytest.raises(RuntimeError):
        pool.release("e")  # holds no reference


def test_lru_order_follows_use():
    pool = pool_of(48)
    for k in ("a", "b", "c"):
        pool.load(ad(k, 16))
    pool.touch("a")
    pool.load(ad("d", 16))
    assert "b" not in pool and "a" in pool


def test_max_rank_and_capacity_checks():
    pool = pool_of(64, max_rank=32)
    with pytest.raises(AdapterPoolFullError, match="max_lora_rank"):
        pool.load(ad("big", 64))
    with pytest.raises(ValueError, match="max_lora_rank"):
        DevicePool(SPECS, capacity_bytes=10 * ROW, max_lora_rank=64)


def test_fragmentation_compacts_and_weights_stay_right():
    pool = pool_of(40)
    adapters = {
        k: ad(k, r, seed=i) for i, (k, r) in enumerate([("a", 8), ("b", 12), ("c", 8), ("d", 12)])
    }
    for a in adapters.values():
        pool.load(a)
    pool.acquire("b")
    pool.acquire("d")
    pool.evict("a")
    pool.evict("c")  # free: 8 rows at 0, 8 rows at 20 -> 16 free but no 16-row extent
    e = ad("e", 16, seed=7)
    pool.load(e)
    assert pool.stats.compactions == 1 and pool.stats.evictions == 2
    res = {k: pool.get(k) for k in ("b", "d", "e")}
    meta = build_lora_meta(
        [(res["b"], 2), (res["d"], 1), (res["e"], 3)],
        max_loras=4,
        num_linears=len(SPECS),
        max_slices=3,
    )
    per_token = [adapters["b"]] * 2 + [adapters["d"]] + [e] * 3
    for lid, spec in enumerate(SPECS):
        x = torch.randn(6, spec.in_features)
        y = torch.zeros(6, spec.out_features)
        lora_delta_torch(
            x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes
        )
        torch.testing.assert_close(
            y.double(), reference_delta(x, per_token, spec), atol=1e-5, rtol=1e-5
        )


def test_unknown_module_is_refused():
    pool = DevicePool(llama_specs(num_layers=1), capacity_bytes=1 << 22, max_lora_rank=64)
    with pytest.raises(ValueError, match="no LoRA rows"):
        pool.load(random_adapter("x", {"q_proj": 4}, seed=0, num_layers=2))

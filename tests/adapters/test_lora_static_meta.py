"""StaticLoraMeta: persistent LoRA metadata buffers for decode graphs take a step's
LoraBatchMeta in place (same addresses), pad rows past the live batch and clear to base-only."""

from __future__ import annotations

import pytest
import torch
from support.lora_reference import llama_specs, random_adapter  # noqa: E402

from loraplex.adapters.device_pool import DevicePool  # noqa: E402
from loraplex.adapters.metadata import build_lora_meta  # noqa: E402
from loraplex.adapters.static_meta import StaticLoraMeta  # noqa: E402


def _meta(max_loras: int = 4):
    specs = llama_specs(num_layers=1)
    pool = DevicePool(specs, capacity_bytes=4_000_000, max_lora_rank=32)
    a = pool.load(random_adapter("a", {"q_proj": 8, "v_proj": 4}, seed=1, num_layers=1))
    b = pool.load(random_adapter("b", {"o_proj": 16}, seed=2, num_layers=1))
    seqs = [(a, 1), (None, 1), (b, 1), (a, 1)]
    return build_lora_meta(seqs, max_loras=max_loras, num_linears=len(specs), max_slices=3), specs


def test_copy_from_fills_in_place_and_pads():
    meta, specs = _meta()
    static = StaticLoraMeta(8, max_loras=4, num_linears=len(specs), max_slices=3, max_rank=32)
    ptrs = [t.data_ptr() for t in (static.token_slot, static.active_slots, static.ranks)]
    static.token_slot.fill_(3)
    static.copy_from(meta, 6)
    assert static.token_slot.tolist() == [0, -1, 1, 0, -1, -1, 3, 3]  # rows past 6: untouched
    assert static.sorted_token_ids[:6].tolist() == [0, 3, 2, 1, 4, 5]
    assert static.active_slots.tolist() == [0, 1, -1, -1]
    assert static.slot_num_tokens.tolist() == [2, 1, 0, 0]
    assert torch.equal(static.ranks, meta.ranks) and torch.equal(static.scales, meta.scales)
    assert [t.data_ptr() for t in (static.token_slot, static.active_slots, static.ranks)] == ptrs
    view = static.view(6)
    assert view.num_tokens == 6 and view.max_rank == 32 and view.max_loras == 4
    assert view.token_slot.data_ptr() == static.token_slot.data_ptr()
    static.clear()
    assert (static.active_slots == -1).all() and (static.slot_num_tokens == 0).all()
    assert (static.token_slot == -1).all()


def test_mismatched_metadata_is_refused():
    meta, specs = _meta()
    small = StaticLoraMeta(3, max_loras=4, num_linears=len(specs), max_slices=3, max_rank=32)
    with pytest.raises(ValueError, match="do not fit"):
        small.copy_from(meta)
    other = StaticLoraMeta(8, max_loras=2, num_linears=len(specs), max_slices=3, max_rank=32)
    with pytest.raises(ValueError, match="max_loras"):
        other.copy_from(meta)
    low = StaticLoraMeta(8, max_loras=4, num_linears=len(specs), max_slices=3, max_rank=8)
    with pytest.raises(ValueError, match="max_rank"):
        low.copy_from(meta)
    with pytest.raises(ValueError, match="outside"):
        low.view(9)

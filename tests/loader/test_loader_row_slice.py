"""Row slices: an expert-parallel rank reads only its experts' rows of a fused 3-D expert
tensor. The range planner turns rows into byte spans (unit tests), and the streaming loader
fetches exactly those bytes from the real S3 server, counted by its own stats."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from loraplex.loader.load_plan import narrow_plan
from loraplex.loader.object_store import ObjectStore
from loraplex.loader.range_plan import Piece, plan_pieces, row_slice
from loraplex.loader.safetensors_header import TensorInfo
from loraplex.loader.select import ExpertShare
from loraplex.loader.stream_reader import StreamConfig, StreamLoader


def _info(shape: tuple[int, ...], begin: int = 100, itemsize: int = 4) -> TensorInfo:
    n = itemsize
    for d in shape:
        n *= d
    return TensorInfo("experts.gate_up_proj", "F32", shape, begin, begin + n)


def test_row_slice_merges_consecutive_rows_and_keeps_order() -> None:
    info = _info((6, 2, 3))  # 24 bytes a row
    shape, pieces = row_slice(info, [1, 2, 4])
    assert shape == (3, 2, 3)
    assert pieces == [Piece(0, 124, 172, 0), Piece(0, 196, 220, 48)]
    shape, pieces = row_slice(info, [4, 1])  # asked order is the output order
    assert shape == (2, 2, 3)
    assert pieces == [Piece(0, 196, 220, 0), Piece(0, 124, 148, 24)]


def test_row_slice_refuses_bad_rows() -> None:
    with pytest.raises(ValueError, match="out of range"):
        row_slice(_info((4, 2)), [4])
    with pytest.raises(ValueError, match="twice"):
        row_slice(_info((4, 2)), [1, 1])
    with pytest.raises(ValueError, match="scalar"):
        row_slice(_info(()), [0])


def test_plan_pieces_covers_each_span_once_into_its_destination() -> None:
    info = _info((8, 5))  # 20 bytes a row
    _, pieces = row_slice(info, [0, 1, 5, 6, 7])
    other = Piece(1, info.end, info.end + 10)  # the next tensor, back to back with row 7
    for chunk in (1, 7, 16, 64, 1000):
        ranges = plan_pieces([*pieces, other], chunk)
        assert all(r.nbytes <= chunk for r in ranges)
        assert sum(r.nbytes for r in ranges) == 5 * 20 + 10  # rows 2-4 are never fetched
        covered: dict[int, list[int]] = {0: [], 1: []}
        for r in ranges:
            assert sum(s.length for s in r.segments) == r.nbytes
            for s in r.segments:
                covered[s.tensor] += range(s.tensor_offset, s.tensor_offset + s.length)
        assert sorted(covered[0]) == list(range(100)) and sorted(covered[1]) == list(range(10))
    with pytest.raises(ValueError, match="overlap"):
        plan_pieces([Piece(0, 0, 10), Piece(1, 5, 15)], 4)


def test_expert_share_names_and_rows() -> None:
    share = ExpertShare(4, {0: frozenset({2, 3}), 2: frozenset({0, 3})})
    assert share.keep("model.layers.0.mlp.experts.3.up_proj.weight")
    assert not share.keep("model.layers.0.mlp.experts.1.up_proj.weight")
    assert not share.keep("model.layers.2.block_sparse_moe.experts.2.w1.weight")
    assert share.keep("model.layers.1.mlp.gate_proj.weight")  # a dense layer
    assert share.keep("model.layers.0.mlp.shared_expert.gate_proj.weight")
    assert share.rows("model.layers.2.mlp.experts.gate_up_proj") == (0, 3)
    assert share.rows("model.layers.0.mlp.experts.down_proj") == (2, 3)
    assert share.rows("model.layers.0.mlp.gate.weight") is None
    assert not share.holds_all()
    assert ExpertShare(2, {0: frozenset({0, 1})}).holds_all()


@pytest.fixture
def loader(s3_storage) -> StreamLoader:
    store = ObjectStore(s3_storage)
    return StreamLoader(store, StreamConfig(chunk_bytes=1000, concurrency=4))


def test_s3_row_slice_fetches_only_the_rows(loader, s3_client, s3_bucket, s3_prefix) -> None:
    gen = torch.Generator().manual_seed(0)
    ref = {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=gen),
        "model.layers.0.mlp.experts.gate_up_proj": torch.randn(6, 10, 8, generator=gen),
        "model.layers.0.mlp.experts.down_proj": torch.randn(6, 8, 5, generator=gen).half(),
        "model.layers.0.mlp.experts.7.up_proj.weight": torch.randn(3, 3, generator=gen),
    }
    key = s3_prefix + "model.safetensors"
    s3_client.put_object(Bucket=s3_bucket, Key=key, Body=save(ref))
    share = ExpertShare(8, {0: frozenset({1, 2, 5})})
    got = loader.load(key, select=share.keep, rows=share.rows)
    assert set(got) == set(ref) - {"model.layers.0.mlp.experts.7.up_proj.weight"}
    assert torch.equal(got["model.embed_tokens.weight"], ref["model.embed_tokens.weight"])
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
        assert got[name].dtype == ref[name].dtype
        assert torch.equal(got[name], ref[name][[1, 2, 5]]), name
    want_bytes = 16 * 8 * 4 + 3 * 10 * 8 * 4 + 3 * 8 * 5 * 2
    assert loader.stats.range_bytes == loader.stats.tensor_bytes == want_bytes
    assert loader.stats.tensors == 3

    # Narrowing a whole plan (headers already read) gives the same tensors, no new header GET.
    whole = loader.plan(key)
    assert whole.shards[0].sha256 is None or whole.total_bytes > want_bytes
    narrowed = narrow_plan(whole, share.keep, share.rows)
    assert narrowed.total_bytes == want_bytes and narrowed.shards[0].sha256 is None
    again = loader.load(narrowed)
    assert all(torch.equal(again[k], got[k]) for k in got)
    # The GPU path's bookkeeping (staging slots, segment copies at row offsets), run on CPU.
    staged = loader.load(narrowed, staging=True)
    assert all(torch.equal(staged[k], got[k]) for k in got)
    with pytest.raises(ValueError, match="out of range"):
        loader.plan(key, rows={"model.layers.0.mlp.experts.down_proj": [6]})

"""Range planning: contiguous runs of wanted tensors cut into fixed-size ranges."""

from __future__ import annotations

import pytest

from loraplex.loader.range_plan import contiguous_runs, plan_ranges
from loraplex.loader.safetensors_header import TensorInfo


def _t(name: str, begin: int, end: int) -> TensorInfo:
    return TensorInfo(name, "U8", (end - begin,), begin, end)


def test_every_byte_of_every_tensor_is_covered_exactly_once() -> None:
    tensors = [_t("a", 100, 130), _t("z", 130, 130), _t("b", 130, 135), _t("c", 135, 200)]
    for chunk in (1, 7, 16, 64, 1000):
        ranges = plan_ranges(tensors, chunk)
        assert all(r.nbytes <= chunk for r in ranges)
        covered: dict[int, list[int]] = {i: [] for i in range(len(tensors))}
        for r in ranges:
            assert sum(s.length for s in r.segments) == r.nbytes
            pos = r.start
            for s in r.segments:
                info = tensors[s.tensor]
                assert info.begin + s.tensor_offset == pos == r.start + s.range_offset
                covered[s.tensor] += range(s.tensor_offset, s.tensor_offset + s.length)
                pos += s.length
        for i, info in enumerate(tensors):
            assert covered[i] == list(range(info.nbytes))


def test_gaps_between_wanted_tensors_are_not_fetched() -> None:
    tensors = [_t("a", 0, 10), _t("c", 50, 60), _t("d", 60, 70)]
    assert [(s, e) for s, e, _ in contiguous_runs(tensors)] == [(0, 10), (50, 70)]
    ranges = plan_ranges(tensors, 1000, file_index=3, tensor_ids=[7, 8, 9])
    assert [(r.start, r.end, r.file_index) for r in ranges] == [(0, 10, 3), (50, 70, 3)]
    assert [s.tensor for s in ranges[1].segments] == [8, 9]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        plan_ranges([_t("a", 0, 10)], 0)
    with pytest.raises(ValueError, match="sorted"):
        plan_ranges([_t("a", 5, 10), _t("b", 0, 5)], 4)

"""The model runner groups each adapter's requests into one contiguous run of the batch."""

from __future__ import annotations

from loraplex.platform.engine.model_runner import group_by_adapter
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.scheduler import ScheduledRequest


def _sched(rid: str, key: str | None) -> ScheduledRequest:
    return ScheduledRequest(Request(rid, [1, 2, 3], SamplingParams(), adapter_key=key), 1, 3)


def test_group_by_adapter_is_stable_and_contiguous_with_base_rows_last() -> None:
    batch = [_sched("a", "k1"), _sched("b", None), _sched("c", "k2"), _sched("d", "k1"),
             _sched("e", None), _sched("f", "k2")]  # fmt: skip
    out = group_by_adapter(batch)
    assert [s.request.request_id for s in out] == ["a", "d", "c", "f", "b", "e"]


def test_group_by_adapter_keeps_a_single_adapter_batch_as_is() -> None:
    batch = [_sched(str(i), "k") for i in range(4)]
    assert group_by_adapter(batch) is batch

"""A reconcile snapshot carries every field the engine mapping reads of a deployment row, so a
launched replica gets the same engine options as one started from the row itself."""

from __future__ import annotations

from loraplex.platform.db.models import BaseModel, Deployment
from loraplex.platform.engine_spec.deployment import engine_config_for_deployment
from loraplex.platform.launcher.reconcile import snapshot


def _row(deterministic: bool) -> Deployment:
    base = BaseModel(
        name="tiny", family="llama", object_prefix="models/tiny/", config={"model_type": "llama"}
    )
    return Deployment(
        name="tiny-dep", base_model=base, weight_quantization="bf16", kv_cache_dtype="auto",
        max_loras=2, max_lora_rank=8, expert_parallel_size=1, replicas=1,
        deterministic=deterministic,
    )  # fmt: skip


def test_snapshot_keeps_deterministic_and_the_base_config() -> None:
    row = _row(deterministic=True)
    snap = snapshot(row)
    assert snap.deterministic is True
    assert snap.base_model.config == {"model_type": "llama"}
    assert snap.base_model.config is not row.base_model.config  # a copy, not the row's dict


def test_snapshot_maps_to_the_rows_engine_config() -> None:
    for deterministic in (False, True):
        row = _row(deterministic)
        from_row = engine_config_for_deployment(row, model="/models/tiny")
        from_snapshot = engine_config_for_deployment(snapshot(row), model="/models/tiny")
        assert from_snapshot == from_row

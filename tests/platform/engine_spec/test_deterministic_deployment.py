"""A deployment's deterministic option (issue 23): the row's `deterministic` becomes the
engine's `--deterministic`; a deployment asking it with a choice the mode does not cover (an
fp8 KV cache) is refused, naming it, before any replica starts; migration 0014 adds the column."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loraplex.platform.engine_spec import engine_args, engine_config_for_deployment
from loraplex.platform.engine_spec.deployment import UnservableDeploymentError


def _row(**kw: object) -> SimpleNamespace:
    base = SimpleNamespace(name="tiny", object_prefix="models/tiny/", config={})
    fields = dict(name="dep", weight_quantization="bf16", kv_cache_dtype="auto", max_loras=2,
                  max_lora_rank=8, expert_parallel_size=1, base_model=base, deterministic=False)  # fmt: skip
    return SimpleNamespace(**(fields | kw))


def test_the_rows_option_reaches_the_engine_command_line() -> None:
    on = engine_config_for_deployment(_row(deterministic=True), model="/m")
    assert on.deterministic is True and "--deterministic" in engine_args(on)
    off = engine_config_for_deployment(_row(), model="/m")
    assert off.deterministic is False


def test_an_uncovered_deterministic_deployment_is_refused_naming_it() -> None:
    with pytest.raises(UnservableDeploymentError, match="deterministic mode does not cover "
                       "kv_cache_dtype fp8"):  # fmt: skip
        engine_config_for_deployment(_row(deterministic=True, kv_cache_dtype="fp8"), model="/m")


def test_the_deployments_table_has_the_column() -> None:
    from loraplex.platform.db.models import Deployment

    column = Deployment.__table__.c.deterministic
    assert not column.nullable and str(column.server_default.arg) == "false"

"""The per-deployment `speculative` option (issue 25): method and K bounds (and a draft model)
on the deployment row become the engine's `--speculative`; combinations the engine does not
serve (expert parallelism: EP followers receive no drafts) are refused naming why; the launcher's
snapshot carries it; migration 0019 adds the column."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from loraplex.platform.engine_spec import (
    EngineConfig,
    engine_args,
    engine_config_for_deployment,
    parse_engine_args,
)
from loraplex.platform.engine_spec.deployment import UnservableDeploymentError
from loraplex.platform.engine_spec.speculative import (
    SpeculativeOption,
    parse_speculative,
    speculative_gap,
)


def _row(**kw: object) -> SimpleNamespace:
    base = SimpleNamespace(name="tiny", object_prefix="models/tiny/", config={})
    fields = dict(name="dep", weight_quantization="bf16", kv_cache_dtype="auto", max_loras=2,
                  max_lora_rank=8, expert_parallel_size=1, base_model=base, deterministic=False,
                  speculative=None)  # fmt: skip
    return SimpleNamespace(**(fields | kw))


def test_the_option_parses_with_defaults_and_prints_canonically() -> None:
    opt = parse_speculative({"method": "ngram", "k_max": 3})
    assert opt == SpeculativeOption(method="ngram", k_min=0, k_max=3)
    assert parse_speculative(opt.to_json()) == opt
    assert json.loads(opt.to_json()) == {"method": "ngram", "k_min": 0, "k_max": 3}
    assert parse_speculative('{"k_max": 3, "method": "ngram"}').to_json() == opt.to_json()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"method": "nope"}, "unknown speculative method 'nope'"),
        ({"method": "eagle"}, "'eagle' is not built"),
        ({"method": "draft_model"}, "needs a draft_model"),
        ({"method": "ngram", "k_max": 0}, "K bounds"),
        ({"method": "ngram", "k_min": 4, "k_max": 2}, "K bounds"),
        ({"method": "ngram", "depth": 2}, "unknown speculative option 'depth'"),
        ({"method": "ngram", "draft_model": "/d"}, "draft_model is only for"),
        ({"method": "ngram", "k_max": "5"}, "k_max must be an integer"),
        ("not json", "JSON object"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_options_are_refused_naming_what(value: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_speculative(value)  # type: ignore[arg-type]


def test_the_engine_option_round_trips_through_the_command_line() -> None:
    config = EngineConfig(model="/m", speculative='{"k_max": 3, "method": "ngram"}')
    assert config.speculative == SpeculativeOption("ngram", 0, 3).to_json()
    argv = engine_args(config)
    assert argv[argv.index("--speculative") + 1] == config.speculative
    back, _ = parse_engine_args(argv)
    assert back == config
    assert "--speculative" not in engine_args(EngineConfig(model="/m"))


def test_expert_parallelism_with_speculation_is_refused() -> None:
    opt = parse_speculative({"method": "ngram"})
    assert "expert parallelism" in (speculative_gap(opt, ep_size=2) or "")
    assert speculative_gap(opt, ep_size=1) is None
    with pytest.raises(ValueError, match="expert parallelism"):
        EngineConfig(model="/m", ep_size=2, speculative=opt.to_json())


def test_the_rows_option_reaches_the_engine_command_line() -> None:
    on = engine_config_for_deployment(_row(speculative={"method": "ngram", "k_max": 4}), model="/m")
    assert parse_speculative(on.speculative).k_max == 4  # type: ignore[arg-type]
    assert "--speculative" in engine_args(on)
    assert engine_config_for_deployment(_row(), model="/m").speculative is None
    old = _row()
    del old.speculative  # a row from before the column: off
    assert engine_config_for_deployment(old, model="/m").speculative is None


def test_a_deployment_the_engine_cannot_speculate_on_is_unservable() -> None:
    row = _row(speculative={"method": "ngram"}, expert_parallel_size=2)
    with pytest.raises(UnservableDeploymentError, match="expert parallelism"):
        engine_config_for_deployment(row, model="/m")


def test_the_launcher_snapshot_carries_it() -> None:
    from loraplex.platform.db.models import BaseModel, Deployment
    from loraplex.platform.launcher.reconcile import snapshot

    base = BaseModel(name="tiny", family="llama", object_prefix="models/tiny/", config={})
    row = Deployment(
        name="tiny-dep", base_model=base, weight_quantization="bf16", kv_cache_dtype="auto",
        max_loras=2, max_lora_rank=8, expert_parallel_size=1, replicas=1, deterministic=False,
        speculative={"method": "ngram", "k_max": 2},
    )  # fmt: skip
    snap = snapshot(row)
    assert snap.speculative == {"method": "ngram", "k_max": 2}
    assert snap.speculative is not row.speculative  # a copy
    from_row = engine_config_for_deployment(row, model="/m")
    assert engine_config_for_deployment(snap, model="/m") == from_row
    assert from_row.speculative is not None


def test_the_deployments_table_has_the_column() -> None:
    from loraplex.platform.db.models import Deployment

    assert Deployment.__table__.c.speculative.nullable

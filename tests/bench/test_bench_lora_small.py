"""`loraplex bench lora --quick --only-small` runs the small-model workload and prints its RESULTs."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMALL_RESULTS = {
    "lora.small_mixed4_tps",
    "lora.small_base_tps",
    "lora.small_lora_unused_tps",
    "lora.small_peft_mixed4_tps",
    "lora.small_hf_base_tps",
    "lora.small_mixed4_over_peft",
    "lora.small_mixed4_over_base",
}


def test_bench_lora_small_prints_results(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    from loraplex.bench.lora import main

    assert main(["--quick", "--only-small"]) == 0
    out = capsys.readouterr().out
    found = dict(re.findall(r"^RESULT (lora\.[a-z0-9_]+)=([0-9.]+)$", out, re.M))
    assert set(found) == SMALL_RESULTS
    assert all(float(v) > 0 for v in found.values())
    tps = float(found["lora.small_mixed4_tps"]) / float(found["lora.small_base_tps"])
    assert float(found["lora.small_mixed4_over_base"]) == pytest.approx(tps, rel=1e-2)


def test_small_model_matches_the_reference_size(tmp_path) -> None:
    pytest.importorskip("transformers")
    from loraplex.bench._lora_small import SMALL, build_small_base

    model = build_small_base(tmp_path / "m", SMALL["vocab"])
    params = sum(p.numel() for p in model.parameters())
    assert 19_000_000 < params < 20_000_000  # the peers' "19M-parameter Llama"
    assert model.config.hidden_size == 256 and model.config.num_hidden_layers == 4

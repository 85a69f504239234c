"""`loraplex bench spec --quick` runs end to end and prints every RESULT line with a number."""

from __future__ import annotations

import re

import pytest

from loraplex.bench import spec


def test_quick_run_prints_every_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert spec.main(["--quick"]) == 0
    out = capsys.readouterr().out
    got = dict(re.findall(r"^RESULT (spec\.[\w.]+)=([0-9.]+)$", out, flags=re.M))
    for name in ("ngram_b1_speedup", "ngram_b1_e2e_speedup", "b4_speedup", "b4_sampled_speedup"):
        assert float(got[f"spec.{name}"]) > 0, name
    assert float(got["spec.ngram_b1_mean_acceptance_length"]) >= 0.0
    assert 0.0 <= float(got["spec.b4_sampled_draft_share"]) <= 1.0
    # the draft-model figures, on (briefly) trained models and adapters
    for name in ("heavy_shift_al_gain", "mild_al_gain", "draft_model_b1_speedup",
                 "draft_adapter_b1_speedup"):  # fmt: skip
        assert float(got[f"spec.{name}"]) > 0, name
    for adapter in ("upper", "rot13", "double", "mild_email", "mild_asyncio", "mild_unittest"):
        assert float(got[f"spec.al_plain_draft.{adapter}"]) >= 1.0
        assert float(got[f"spec.al_draft_adapter.{adapter}"]) >= 1.0

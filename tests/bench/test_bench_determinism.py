"""`loraplex bench determinism --quick`: every RESULT line printed, the mode's answers to
identical requests one distinct answer."""

from __future__ import annotations

import pytest

from loraplex.bench.determinism import main
from loraplex.platform.engine.layers.fixed_order_cpu import fixed_order_available


@pytest.mark.skipif(not fixed_order_available(), reason="no C compiler here")
def test_quick_run_prints_every_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT ")]
    results = dict(ln.removeprefix("RESULT ").split("=") for ln in lines)
    want = {"decode_b1_ratio", "decode_b4_ratio", "prefill_ratio", "distinct_outputs_off",
            "distinct_outputs_on"}  # fmt: skip
    assert set(results) == {f"determinism.{k}" for k in want}
    assert all(float(v) > 0 for k, v in results.items() if k.endswith("_ratio"))
    assert float(results["determinism.distinct_outputs_on"]) == 1


@pytest.mark.skipif(not fixed_order_available(), reason="no C compiler here")
def test_the_gateway_count_runs_through_the_platform(capsys: pytest.CaptureFixture[str]) -> None:
    """Identical requests sent at once through a real local platform (gateway, replica): with
    the deployment's deterministic option one distinct answer; the count without is printed."""
    assert main(["--quick", "--gateway-requests", "48", "--gateway-tokens", "6"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT ")]
    results = dict(ln.removeprefix("RESULT ").split("=") for ln in lines)
    assert float(results["determinism.gateway_requests"]) == 48
    assert float(results["determinism.gateway_distinct_on"]) == 1
    assert float(results["determinism.gateway_distinct_off"]) >= 1

"""`loraplex bench structured --quick`: the benchmark runs end to end at tiny sizes and prints
every RESULT line (the real numbers come from the full run, not from a test)."""

from __future__ import annotations

import re

import pytest

NAMES = {
    "constrained_tok_s", "free_tok_s", "constrained_over_free", "free_us_per_token",
    "tokenizer_build_ms", "first_compile_ms", "cached_compile_ms", "cached_over_first_compile",
    "mask_us_per_token", "mask_over_decode_token",
}  # fmt: skip


def test_quick_run_prints_every_result(capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.platform.cli import main

    assert main(["bench", "structured", "--quick"]) == 0
    out = capsys.readouterr().out
    results = dict(re.findall(r"^RESULT structured\.([a-z_]+)=(\S+)$", out, re.M))
    assert set(results) >= NAMES
    assert all(float(v) > 0 for v in results.values())

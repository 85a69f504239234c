"""`loraplex bench engine` runs end to end (tiny settings) and prints all its RESULT lines."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_bench_engine_prints_results(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from loraplex.bench.engine import main

    argv = ["--requests", "6", "--max-num-seqs", "4", "--prefix-len", "96", "--long-prompt",
            "160", "--chunk-budget", "32", "--streams", "2", "--repeats", "1", "--hidden", "64"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    found = dict(re.findall(r"^RESULT (engine\.[a-z0-9_]+)=([0-9.]+)$", out, re.M))
    assert set(found) == {
        "engine.continuous_over_static",
        "engine.over_hf_generate",
        "engine.prefix_hit_ttft_speedup",
        "engine.itl_p95_ms_chunked",
        "engine.itl_p95_ms_unchunked",
    }
    assert all(float(v) > 0 for v in found.values())

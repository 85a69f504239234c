"""`loraplex bench moe-quant` at tiny sizes: it serves each choice and prints every RESULT
line, the weight bytes ratios from the replica's own accounting."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("transformers")


def test_bench_moe_quant_prints_every_result(capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.platform.cli import main

    argv = ["bench", "moe-quant", "--hidden", "128", "--intermediate", "256", "--experts", "8",
            "--layers", "1", "--rounds", "1", "--decode-steps", "2", "--choices", "int8,int4"]  # fmt: skip
    assert main(argv) == 0
    found = dict(
        re.findall(r"^RESULT moe_quant\.([a-z0-9_]+)=(\S+)$", capsys.readouterr().out, re.M)
    )
    assert set(found) == {
        f"{c}_{m}" for c in ("int8", "int4")
        for m in ("weight_bytes_ratio", "decode_speedup_b1", "decode_speedup_b8")
    }  # fmt: skip
    assert 0.4 < float(found["int8_weight_bytes_ratio"]) < 0.6
    assert float(found["int4_weight_bytes_ratio"]) < float(found["int8_weight_bytes_ratio"]) - 0.15
    assert all(float(v) > 0 for v in found.values())

"""`loraplex bench load`, small: a real local stack (embedded PostgreSQL, SeaweedFS, Redis, a
worker, the API and a replica), concurrent streams over several adapters with slow readers and
hang-ups; no request fails or hangs, and the replica ends idle (no KV block in use, no adapter
reference held). 120 streams: more than redis-py's default pool of 100 connections, which
answered 503 `redis_unavailable` to most of them before the gateway's pool blocked instead."""

from __future__ import annotations

import re

import pytest

from loraplex.bench import load

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]


def test_small_load_run_ends_idle(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--streams", "120", "--adapters", "3", "--duration", "6", "--max-tokens", "12",
        "--slow-fraction", "0.25", "--drop-fraction", "0.25", "--slow-delay-ms", "50",
        "--baseline-requests", "3", "--request-deadline", "90",
    ]  # fmt: skip
    assert load.main(argv) == 0
    out = capsys.readouterr().out
    results = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^RESULT load\.([\w.]+)=(\S+)$", out, re.M)
    }
    for name in ("ttft_p95_ms", "error_rate", "kv_blocks_in_use_end", "adapter_references_end"):
        assert name in results, out
    assert results["requests"] >= 120 and results["dropped"] >= 1, results
    # No request may fail on the platform's own plumbing (Redis pool, hung streams); on a
    # starved shared CPU the one replica may drop a connection now and then (a 503 the
    # client can retry), so a few of those are tolerated.
    assert not [k for k in results if k.startswith("errors.") and "no_replica" not in k], results
    assert results["error_rate"] <= 0.1, results
    assert results["ttft_p95_ms"] > 0 and results["baseline_ttft_p95_ms"] > 0
    assert results["kv_blocks_in_use_end"] == 0 and results["adapter_references_end"] == 0
    assert results["requests_running_end"] == 0

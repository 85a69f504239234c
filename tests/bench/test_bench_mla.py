"""`bench mla` prints the latent cache's bytes per token beside the expanded baseline."""

from __future__ import annotations

from loraplex.bench import mla


def test_bench_mla_reports_latent_against_expanded(capsys):
    assert mla.main([]) == 0
    lines = dict(
        line.removeprefix("RESULT ").split("=") for line in capsys.readouterr().out.splitlines()
    )
    # bf16: (512 latent + 64 rope) x 2 bytes, against 128 heads x (192 + 128) x 2 bytes
    assert lines["mla.deepseek_v3.kv_bytes_per_token_per_layer"] == "1152"
    assert lines["mla.deepseek_v3.expanded_kv_bytes_per_token_per_layer"] == "81920"
    assert float(lines["mla.deepseek_v2_lite.expanded_over_latent"]) > 8

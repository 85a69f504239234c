"""`loraplex bench NAME` runs `loraplex.bench.NAME`: the CLI reaches the benchmarks part by
import string, so no runtime module imports it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

from loraplex.platform.cli import available_benches


def test_bench_lists_the_modules_of_the_bench_part() -> None:
    import loraplex.bench

    public = {m.name for m in pkgutil.iter_modules(loraplex.bench.__path__)}
    public = {n for n in public if not n.startswith("_")}
    assert set(available_benches()) == public
    assert {"serve", "gpu_check", "engine"} <= public


def test_bench_runs_a_module_of_the_bench_part() -> None:
    cli = [sys.executable, "-m", "loraplex.platform.cli", "bench"]
    out = subprocess.run([*cli], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "serve" in out.stdout, out.stdout + out.stderr
    run = [*cli, "gpu-check", "--dry-run", "--only", "lora_fp16"]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_without_the_bench_part_it_says_so(monkeypatch, capsys) -> None:
    """The container images install the runtime parts only: `loraplex bench` there says the
    benchmarks are not installed instead of failing on an import."""
    import loraplex.platform.cli as cli

    monkeypatch.setattr(cli, "BENCH_PACKAGE", "loraplex.no_such_bench_part")
    assert cli.available_benches() == []
    assert cli.main(["bench", "serve"]) == 2
    assert "benchmarks are not installed" in capsys.readouterr().err

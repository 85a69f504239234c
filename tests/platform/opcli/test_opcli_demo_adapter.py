"""`loraplex demo adapter`: the files load in peft (the oracle, test-only), every tensor lands
on its module, and the adapter changes the demo model's output; the shape table agrees with
the demo model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.opcli import CLI, OperatorShell


def _peft_over_demo(model_dir: Path, adapter_dir: Path):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    prompt = torch.tensor([[1, 17, 230, 45, 99, 512, 7, 301]])
    with torch.no_grad():
        base_logits = base(prompt).logits
        base_tokens = base.generate(prompt, max_new_tokens=12, do_sample=False)
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    return model, prompt, base_logits, base_tokens


def test_demo_shape_matches_the_demo_model() -> None:
    from loraplex.platform import demo_model
    from loraplex.platform.opcli.demo_adapter import DEMO_SHAPE

    config = demo_model.llama_config(demo_model.TARGET_VOCAB)
    assert {k: config[k] for k in DEMO_SHAPE} == DEMO_SHAPE


@pytest.mark.parametrize(("targets", "modules"), [(None, 2), ("all", 7)])
def test_demo_adapter_loads_in_peft_and_changes_outputs(
    demo_model_dir: Path, tmp_path: Path, targets: str | None, modules: int
) -> None:
    shell = OperatorShell("http://unused", "")
    extra = ["--targets", targets] if targets else []  # default: q_proj, v_proj (the README's)
    out = shell.ok("demo", "adapter", "--out", str(tmp_path / "ad"), *extra)
    adapter_dir = Path(out.stdout.strip())
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert len(tensors) == 4 * modules * 2  # layers x projections x (A, B)

    model, prompt, base_logits, base_tokens = _peft_over_demo(demo_model_dir, adapter_dir)
    params = dict(model.named_parameters())
    for name, value in tensors.items():
        loaded = params[name.replace(".weight", ".default.weight")]
        assert torch.equal(loaded.detach(), value), name  # every tensor reached its module
    with torch.no_grad():
        logits = model(prompt).logits
        tokens = model.generate(input_ids=prompt, max_new_tokens=12, do_sample=False)
    assert (logits - base_logits).abs().max() > 0.05
    assert not torch.equal(tokens, base_tokens), "the adapter should change greedy output"
    with torch.no_grad(), model.disable_adapter():
        assert torch.allclose(model(prompt).logits, base_logits, atol=1e-5)


def test_demo_adapter_default_is_small_and_deterministic(tmp_path: Path) -> None:
    shell = OperatorShell("http://unused", "")
    a = Path(shell.ok("demo", "adapter", "--out", str(tmp_path / "a")).stdout.strip())
    b = Path(shell.ok("demo", "adapter", "--out", str(tmp_path / "b")).stdout.strip())
    c = Path(
        shell.ok("demo", "adapter", "--out", str(tmp_path / "c"), "--seed", "1").stdout.strip()
    )
    wa, wb, wc = (p / "adapter_model.safetensors" for p in (a, b, c))
    assert wa.read_bytes() == wb.read_bytes() != wc.read_bytes()
    assert wa.stat().st_size < 1 << 20
    assert json.loads((a / "adapter_config.json").read_text())["target_modules"] == [
        "q_proj", "v_proj"
    ]  # fmt: skip
    bad = shell.fails("demo", "adapter", "--out", str(tmp_path / "d"), "--targets", "qq_proj")
    assert "targets must be some of" in bad.stderr and "qq_proj" in bad.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("argv", [["demo", "adapter", "--help"], ["adapters", "push", "--help"]])
def test_help_runs(argv: list[str]) -> None:
    import subprocess

    out = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage: loraplex" in out.stdout

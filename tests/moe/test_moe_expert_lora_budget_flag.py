"""`--expert-lora-memory-bytes`: an EngineConfig field with its own flag, validated, that sizes
the replica's expert-LoRA byte budget (what admission counts), and is refused on a dense base
rather than ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fixtures import tiny_llama

from loraplex.platform.engine_spec.cli import engine_args, parse_engine_args
from loraplex.platform.engine_spec.config import EngineConfig

__all__ = ["tiny_llama"]  # a fixture

pytest.importorskip("peft")


def test_flag_parses_round_trips_and_is_validated() -> None:
    cfg, _ = parse_engine_args(["--model", "m", "--expert-lora-memory-bytes", "4096"])
    assert cfg.expert_lora_memory_bytes == 4096
    assert "--expert-lora-memory-bytes" in engine_args(cfg)
    assert EngineConfig(model="m").expert_lora_memory_bytes is None
    with pytest.raises(ValueError, match="expert_lora_memory_bytes"):
        EngineConfig(model="m", expert_lora_memory_bytes=0)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from support.expert_adapters import moe_base

    base = tmp_path_factory.mktemp("moe_base")
    moe_base("qwen3_moe").save_pretrained(str(base))
    return str(base)


def _served(model: str, budget: int | None):
    """The engine and runtime as `loraplex engine` builds them from its command line."""
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.lora.runtime import LoraRuntime

    argv = ["--model", model, "--dtype", "float32", "--max-loras", "2", "--max-lora-rank", "8",
            "--max-num-seqs", "4", "--max-num-batched-tokens", "32", "--block-size", "4"]  # fmt: skip
    if budget is not None:
        argv += ["--expert-lora-memory-bytes", str(budget)]
    cfg, _ = parse_engine_args(argv)
    core = EngineCore(cfg)
    runtime = LoraRuntime.for_engine(core)
    core.install_lora_runtime(runtime)
    return core, runtime


def test_flag_reaches_the_engines_expert_lora_budget(moe_dir: str) -> None:
    _, default = _served(moe_dir, None)
    assert default.experts is not None
    assert default.experts.capacity_bytes == 2 * default.experts.max_rank_bytes(8)
    _, runtime = _served(moe_dir, 12345)
    assert runtime.experts is not None and runtime.experts.capacity_bytes == 12345


def test_flag_is_refused_on_a_dense_base(tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match="expert_lora_memory_bytes.*no MoE experts"):
        _served(str(tiny_llama), 12345)

"""`EngineConfig.cpu_threads` sets the CPU engine process's torch intra-op threads."""

from __future__ import annotations

import torch

from loraplex.bench._synthetic.models import save_tiny_model
from loraplex.platform.engine import LLM


def test_cpu_threads_sets_torch_threads_and_default_leaves_them(tmp_path):
    save_tiny_model(tmp_path / "m", "llama", seed=1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        LLM(str(tmp_path / "m"), dtype="float32", max_loras=0)
        assert torch.get_num_threads() == 2
        LLM(str(tmp_path / "m"), dtype="float32", max_loras=0, cpu_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)

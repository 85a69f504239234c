"""Prompt lookup rests (issue 25, "never slower"): in a large batch, a request whose lookups keep
finding nothing skips lookups for 1, 2, 4, ... steps (at most 16, and at most batch / 4), so a
batch that never repeats itself stops paying a lookup per request per step; a small batch (where
a lookup costs nothing next to the step) looks up every step."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.bench._synthetic.models import save_tiny_model
from loraplex.platform.engine import LLM, SamplingParams
from loraplex.platform.engine.speculative import SpecConfig


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("base")
    save_tiny_model(path, "llama", seed=5)
    return str(path)


def _lookups(base: str, batch: int) -> tuple[int, int]:
    """(lookups made, request-steps) serving `batch` random prompts sampled at temperature 1."""
    llm = LLM(base, block_size=4, max_num_batched_tokens=2048, max_num_seqs=batch)
    llm.core.enable_speculation(SpecConfig())
    spec = llm.core.speculator
    assert spec is not None
    calls = [0]
    propose = spec.propose

    def counted(*args: Any) -> list[int]:
        calls[0] += 1
        return propose(*args)

    spec.propose = counted  # type: ignore[method-assign]
    prompts = [[(37 * i + 11 * j) % 120 + 3 for j in range(16)] for i in range(batch)]
    params = SamplingParams(temperature=1.0, seed=None, max_tokens=48, ignore_eos=True)
    llm.generate(prompts, params)
    return calls[0], batch * 48


def test_a_large_batch_that_never_repeats_rests_its_lookups(base: str) -> None:
    calls, steps = _lookups(base, 16)  # rests of at most 16 // 4 = 4 steps
    assert calls < 0.4 * steps, (calls, steps)


def test_a_small_batch_looks_up_every_step(base: str) -> None:
    calls, steps = _lookups(base, 2)
    assert calls >= 0.6 * steps, (calls, steps)  # the steps the controller drafts on

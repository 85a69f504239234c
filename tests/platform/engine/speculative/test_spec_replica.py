"""A replica built with `EngineConfig.speculative` speculates from its first step, shows the
option on `/state`, and reports acceptance per adapter (drafted tokens, accepted tokens, mean
acceptance length) on `/state` and on `/metrics` (issue 25)."""

from __future__ import annotations

import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402

OPTION = '{"method":"ngram","k_min":0,"k_max":4}'


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    base = tmp_path_factory.mktemp("base")
    hf = save_tiny_model(base, "llama", seed=11)
    adapter = make_adapter(hf, tmp_path_factory.mktemp("a"), seed=41, r=4, lora_alpha=8,
                           target_modules=["q_proj", "v_proj"])  # fmt: skip
    return str(base), str(adapter)


def _llm(base: str, **kw: object) -> LLM:
    return LLM(base, block_size=4, max_num_batched_tokens=256, max_num_seqs=16, max_loras=2,
               max_lora_rank=8, **kw)  # fmt: skip


def _samples(text: bytes, name: str) -> dict[str, float]:
    """adapter label -> value of metric family `name` (a counter's `_total` sample)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text.decode()):
        if fam.name == name:
            for s in fam.samples:
                if not s.name.endswith("_created"):
                    out[s.labels["adapter"]] = s.value
    return out


def test_a_speculative_replica_reports_acceptance_per_adapter(world: tuple[str, str]) -> None:
    base, adapter = world
    llm = _llm(base, speculative=OPTION)
    core = llm.core
    assert core.speculator is not None and core.speculator.config.k_max == 4
    state = core.state().speculative
    assert state is not None and (state.method, state.k_min, state.k_max) == ("ngram", 0, 4)
    assert state.acceptance == []
    prompts = [[5, 6, 7, 8, 9] * 4, [11, 12, 13] * 5, [20, 21, 22, 23] * 3, [30, 31] * 6]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm.generate(prompts, params, adapters=[None, adapter, None, adapter])
    stats = core.speculator.stats
    assert None in stats and len(stats) == 2  # the base model and the adapter
    shown = {a.adapter: a for a in core.state().speculative.acceptance}
    assert set(shown) == set(stats)
    for key, st in stats.items():
        got = shown[key]
        assert (got.verifications, got.drafted_tokens, got.accepted_tokens) == (
            st.verifications, st.drafted, st.accepted)  # fmt: skip
        assert got.mean_acceptance_length == pytest.approx(st.mean_acceptance_length)
        assert st.drafted > 0
    text = core.metrics.render()
    labels = {("" if k is None else k): st for k, st in stats.items()}
    drafted = _samples(text, "loraplex:spec_decode_num_draft_tokens")
    accepted = _samples(text, "loraplex:spec_decode_num_accepted_tokens")
    verifications = _samples(text, "loraplex:spec_decode_num_drafts")
    mean = _samples(text, "loraplex:spec_decode_mean_acceptance_length")
    assert drafted == {k: float(st.drafted) for k, st in labels.items()}
    assert accepted == {k: float(st.accepted) for k, st in labels.items()}
    assert verifications == {k: float(st.verifications) for k, st in labels.items()}
    assert mean == pytest.approx({k: st.mean_acceptance_length for k, st in labels.items()})


def test_a_plain_replica_shows_no_speculation(world: tuple[str, str]) -> None:
    core = _llm(world[0]).core
    assert core.speculator is None and core.state().speculative is None
    assert _samples(core.metrics.render(), "loraplex:spec_decode_num_draft_tokens") == {}


def test_the_guard_measures_decode_steps_through_the_engine(world: tuple[str, str]) -> None:
    """The draft guard gets each decode step's cost (with and without drafts), so it can turn
    drafting off where it measured slower (it was judged after the step, when the request's
    new tokens made the step look like a prefill, and never measured)."""
    llm = _llm(world[0], speculative=OPTION)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    llm.generate([[5, 6, 7, 8, 9] * 4], params)
    with_drafts, without = llm.core.speculator.guard.seconds_per_token(1)
    assert with_drafts is not None and without is not None

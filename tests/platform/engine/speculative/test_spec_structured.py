"""Structured output on a speculating replica (issue 25): a request with a grammar speculates
exactly. Its prompt-lookup drafts are cut at the first token the grammar refuses (never
verified), every verification row is sampled under the grammar's mask at that row's position
(the mask after the drafts before it), and the matcher is left where it was. Greedy and seeded
outputs are token-identical with speculation on and off, in batches that mix constrained and
free requests, and always match their constraint; the constrained requests do draft."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from loraplex.bench._synthetic.json_schemas import json_schemas
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine import LLM, SamplingParams
from loraplex.platform.engine.speculative import SpecConfig
from loraplex.platform.engine.structured import GrammarSpec

pytestmark = pytest.mark.timeout(600)
FORCED = SpecConfig(k_max=4, adaptive=False)  # always draft: the tests must exercise it
REGEX = r"([0-9]{2}-){3,8}[a-z]{1,3}"
CHOICE = ("alpha alpha alpha alpha", "beta beta beta beta", "gamma")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_demo_model(tmp_path_factory.mktemp("demo")))


def _greedy_ok(schema: dict) -> bool:
    return '"number"' not in json.dumps(schema)  # see test_structured_engine.greedy_ok


def _workload() -> tuple[list[str], list[SamplingParams], list[object]]:
    """Constrained requests (schemas, a regex, a choice; greedy and seeded) mixed with free
    copy-heavy ones; per request the check its text must pass (None: free)."""
    prompts: list[str] = []
    params: list[SamplingParams] = []
    checks: list[object] = []
    schemas = [s for s in json_schemas() if _greedy_ok(s)][:12]
    for i, schema in enumerate(schemas):
        temp = 0.0 if i % 2 == 0 else 1.0
        spec = GrammarSpec("json_schema", json.dumps(schema))
        prompts.append(f"request {i}")
        params.append(SamplingParams(temperature=temp, seed=i, max_tokens=200, structured=spec))
        checks.append(schema)
    for i in range(6):
        spec = GrammarSpec("regex", REGEX) if i % 2 else GrammarSpec("choice", choices=CHOICE)
        prompts.append("12-34-56-78-12-34-56-ab alpha alpha alpha alpha " * 2)
        params.append(SamplingParams(temperature=1.0 if i % 3 else 0.0, seed=100 + i,
                                     max_tokens=120, structured=spec))  # fmt: skip
        checks.append(REGEX if i % 2 else "|".join(re.escape(c) for c in CHOICE))
    for i in range(8):
        prompts.append("the cat sat on the mat and the cat sat on the mat " * 3)
        params.append(SamplingParams(temperature=0.0 if i % 2 else 1.0, seed=200 + i,
                                     max_tokens=40, ignore_eos=True))  # fmt: skip
        checks.append(None)
    return prompts, params, checks


def _check(text: str, check: object) -> None:
    if isinstance(check, dict):
        jsonschema.validate(json.loads(text), check)
    elif isinstance(check, str):
        assert re.fullmatch(check, text), text


def test_constrained_requests_speculate_token_identically(model_dir: str) -> None:
    prompts, params, checks = _workload()
    plain = LLM(model_dir, max_num_seqs=64).generate(prompts, params)
    llm = LLM(model_dir, max_num_seqs=64)
    llm.core.enable_speculation(FORCED)
    on = llm.generate(prompts, params)
    for a, b, check in zip(plain, on, checks, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids, (a.outputs[0].text, check)
        if check is not None:
            assert b.outputs[0].finish_reason == "stop", b.outputs[0].text
            _check(b.outputs[0].text, check)
    assert llm.core.pool.num_free_blocks == llm.core.pool.num_blocks

    # The constrained requests alone: they draft, and some drafts are accepted.
    constrained = [i for i, c in enumerate(checks) if c is not None]
    llm = LLM(model_dir, max_num_seqs=64)
    llm.core.enable_speculation(FORCED)
    outs = llm.generate([prompts[i] for i in constrained], [params[i] for i in constrained])
    for out, i in zip(outs, constrained, strict=True):
        assert out.outputs[0].token_ids == plain[i].outputs[0].token_ids
    spec = llm.core.speculator
    assert spec is not None
    stats = spec.stats[None]
    assert stats.drafted > 50 and stats.accepted > 10, stats


def test_drafts_the_grammar_refuses_are_cut_before_verification(model_dir: str) -> None:
    """Prompt-lookup drafts are cut at the first token the grammar refuses; the matcher does
    not move."""
    from loraplex.platform.engine.speculative.grammar_drafts import allowed_prefix

    llm = LLM(model_dir, max_num_seqs=8)
    core = llm.core
    state = core._grammar_state(SamplingParams(structured=GrammarSpec("regex", r"[0-9]{4}")))
    assert state is not None and core.tokenizer is not None
    hf = core.tokenizer.tokenizer
    digits = hf.encode("12", add_special_tokens=False).ids
    letters = hf.encode("ab", add_special_tokens=False).ids
    assert digits and letters
    assert allowed_prefix(state, digits + letters + digits) == digits
    assert allowed_prefix(state, letters + digits) == []
    assert state.num_accepted == 0 and not state.matcher.is_error()
    assert allowed_prefix(state, digits + digits) == digits + digits

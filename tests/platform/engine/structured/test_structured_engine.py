"""Structured outputs in the engine, on the random-weight demo model (its free text is noise,
so a valid document can only come from the grammar): fifty JSON schemas, regex/choice/grammar
constraints, the mask seen by greedy/temperature/logprobs, logit_bias, `max_tokens` mid-JSON,
preemption and prefix-cache hits, the mask filled while the forward runs, the compile cache."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from loraplex.bench._synthetic.json_schemas import json_schemas
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine import LLM, SamplingParams
from loraplex.platform.engine.structured import GrammarSpec

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_demo_model(tmp_path_factory.mktemp("demo")))


@pytest.fixture(scope="module")
def llm(model_dir: str) -> LLM:
    return LLM(model_dir, max_num_seqs=64)


def schema_params(schema: dict, seed: int, **kw: object) -> SamplingParams:
    args: dict = dict(temperature=1.0, seed=seed, max_tokens=400)
    args.update(kw)
    return SamplingParams(structured=GrammarSpec("json_schema", json.dumps(schema)), **args)


def greedy_ok(schema: dict) -> bool:
    """Greedy decoding of this noise model repeats one digit forever in a `number`'s fraction
    (a valid prefix that never ends); integers, strings and arrays are bounded."""
    return '"number"' not in json.dumps(schema)


def test_fifty_schemas_all_valid_in_one_batch(llm: LLM) -> None:
    schemas = json_schemas()
    assert len(schemas) == 50
    params = [
        schema_params(s, seed=i, temperature=0.0 if greedy_ok(s) and i % 3 == 0 else 1.0)
        for i, s in enumerate(schemas)
    ]
    outs = llm.generate([f"request {i}" for i in range(50)], params)
    for schema, out in zip(schemas, outs, strict=True):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (schema, c.text)
        jsonschema.validate(json.loads(c.text), schema)


def test_free_output_of_the_same_model_is_not_json(llm: LLM) -> None:
    """The control: without the constraint the demo model writes noise, not JSON."""
    out = llm.generate(["request 0"], SamplingParams(temperature=0.0, max_tokens=40))[0]
    with pytest.raises(ValueError):
        json.loads(out.outputs[0].text)


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        (GrammarSpec("regex", r"[0-9]{3}-[a-z]{2,4}"), r"[0-9]{3}-[a-z]{2,4}"),
        (GrammarSpec("choice", choices=("yes", "no", "maybe so")), r"yes|no|maybe so"),
        (GrammarSpec("grammar", 'start: "(" num ("+" num)* ")"\nnum: /[0-9]{1,3}/'),
         r"\([0-9]{1,3}(\+[0-9]{1,3})*\)"),
    ],
)  # fmt: skip
def test_regex_choice_and_grammar(llm: LLM, spec: GrammarSpec, check: str) -> None:
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200, structured=spec)
              for s in range(6)]  # fmt: skip
    for out in llm.generate(["pick one"] * 6, params):
        c = out.outputs[0]
        assert c.finish_reason == "stop"
        assert re.fullmatch(check, c.text), c.text


def test_json_object_is_an_object(llm: LLM) -> None:
    spec = GrammarSpec("json_object")
    out = llm.generate(["obj"], SamplingParams(temperature=0.0, max_tokens=300, structured=spec))
    assert isinstance(json.loads(out[0].outputs[0].text), dict)


def test_logprobs_see_the_masked_distribution(llm: LLM) -> None:
    spec = GrammarSpec("regex", "[ab]{12}")
    tok = llm.get_tokenizer()
    p = SamplingParams(temperature=1.0, top_p=0.95, seed=3, max_tokens=40, logprobs=5,
                       structured=spec)  # fmt: skip
    c = llm.generate(["x"], p)[0].outputs[0]
    assert re.fullmatch("[ab]{12}", c.text)
    for token, entry in zip(c.token_ids[:-1], c.logprobs[:-1], strict=True):
        assert token in entry
        for alt, lp in entry.items():  # every finite candidate is allowed by the grammar
            if lp > float("-inf"):
                assert set(tok.decode([alt])) <= {"a", "b"}, tok.decode([alt])


def test_logit_bias_moves_greedy(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    target = tok.encode("apples", add_special_tokens=False)[0]
    p = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logit_bias={target: 100})
    assert llm.generate(["x"], p)[0].outputs[0].token_ids == [target] * 5
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(["x"], SamplingParams(logit_bias={10**7: 1.0}))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: 101.0})


def test_max_tokens_mid_json_is_length(llm: LLM) -> None:
    schema = json_schemas()[45]
    c = llm.generate(["x"], schema_params(schema, seed=1, max_tokens=4))[0].outputs[0]
    assert c.finish_reason == "length"
    assert len(c.token_ids) == 4
    with pytest.raises(ValueError):
        json.loads(c.text)


def test_invalid_constraints_are_refused(llm: LLM) -> None:
    for spec in (
        GrammarSpec("json_schema", "{not json"),
        # a keyword the grammar engine does not implement is refused, never ignored
        GrammarSpec("json_schema", json.dumps({"type": "array", "uniqueItems": True})),
        GrammarSpec("regex", "(unclosed"),
        GrammarSpec("grammar", "start: undefined_rule"),
    ):
        with pytest.raises(ValueError):
            llm.generate(["x"], SamplingParams(structured=spec))
    assert not llm.core.has_unfinished()


def test_compiled_grammar_is_cached_by_content(llm: LLM) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 77}}}
    llm.generate(["x"], schema_params(schema, seed=0, max_tokens=2))
    compiler = llm.core.grammars
    assert compiler is not None and not compiler.last_was_cached
    llm.generate(["y"], schema_params(schema, seed=1, max_tokens=2))
    assert compiler.last_was_cached


def test_preemption_and_prefix_hits_keep_grammar_state(model_dir: str) -> None:
    """Tight KV: requests are preempted (recomputed) mid-document; outputs equal those of a
    roomy engine, and a second pass over the same prompt hits the prefix cache."""
    schemas = json_schemas()[1:4]
    prompts = [f"one shared prefix for all, number {i}" for i in range(3)]
    params = [schema_params(s, seed=i, temperature=0.0 if greedy_ok(s) else 0.7, max_tokens=70)
              for i, s in enumerate(schemas)]  # fmt: skip
    roomy = LLM(model_dir, max_num_seqs=4, max_model_len=96)
    ref_outs = [o.outputs[0] for o in roomy.generate(prompts, params)]
    ref = [c.text for c in ref_outs]
    tight = LLM(model_dir, max_num_seqs=4, max_model_len=96, block_size=8, num_gpu_blocks=12)
    got = [o.outputs[0].text for o in tight.generate(prompts, params)]
    assert tight.core.scheduler.num_preemptions > 0
    assert got == ref
    again = tight.generate(prompts[:1], params[:1])
    assert again[0].outputs[0].text == ref[0]
    assert again[0].num_cached_tokens > 0
    stopped = [(s, c.text) for s, c in zip(schemas, ref_outs, strict=True)
               if c.finish_reason == "stop"]  # fmt: skip
    assert len(stopped) >= 2  # another may reach max_tokens mid-document
    for schema, text in stopped:
        jsonschema.validate(json.loads(text), schema)


def test_mask_is_filled_while_the_forward_runs(llm: LLM) -> None:
    """A forward pre-hook on the model sees the fill already handed to the mask worker."""
    seen: list[bool] = []
    filler = llm.core.runner.mask_filler

    def hook(module: object, args: object) -> None:
        seen.append(filler.pending)

    handle = llm.core.model.register_forward_pre_hook(hook)
    try:
        llm.generate(["x"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                           structured=GrammarSpec("regex", "[a-z]{8}")))  # fmt: skip
    finally:
        handle.remove()
    assert seen and all(seen)


def test_a_finished_grammar_may_end_below_min_tokens(llm: LLM) -> None:
    """Once the grammar allows only EOS, min_tokens does not ban it (the mask wins): the
    request stops with its valid output instead of being aborted."""
    spec = GrammarSpec("choice", choices=("ok",))
    p = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=10, structured=spec)
    c = llm.generate(["x"], p)[0].outputs[0]
    assert (c.text, c.finish_reason) == ("ok", "stop")

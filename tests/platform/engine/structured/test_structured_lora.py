"""Constrained and free requests, on a tenant's adapter and on the base model, in one engine
batch: every constrained output is valid, each equals the same request run alone (the mask
rows follow the batch's adapter grouping), and the adapter changes what is generated."""

from __future__ import annotations

import json

import jsonschema
import pytest
from support.peft_adapters import make_peft_adapter

from loraplex.bench._synthetic.json_schemas import json_schemas
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine import LLM, SamplingParams
from loraplex.platform.engine.structured import GrammarSpec

pytestmark = pytest.mark.timeout(300)


def test_mixed_adapter_and_base_batch(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = make_demo_model(tmp_path_factory.mktemp("demo"))
    adapter = str(make_peft_adapter(model, tmp_path_factory.mktemp("lora"), seed=5))
    schema = json_schemas()[1]  # integers and bounded strings: greedy ends
    spec = GrammarSpec("json_schema", json.dumps(schema))
    constrained = SamplingParams(temperature=0.0, max_tokens=120, structured=spec)
    free = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = ["free text", "a person", "a person", "free text"]
    params = [free, constrained, constrained, free]
    adapters = [None, adapter, None, adapter]
    llm = LLM(str(model), max_loras=2, max_num_seqs=8)
    batch = llm.generate(prompts, params, adapters)
    for i in (1, 2):  # the same request alone
        alone = llm.generate([prompts[i]], [params[i]], [adapters[i]])[0]
        assert batch[i].outputs[0].token_ids == alone.outputs[0].token_ids
    for i in (1, 2):
        c = batch[i].outputs[0]
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)
    assert batch[1].outputs[0].text != batch[2].outputs[0].text  # the adapter is applied

"""Decode steps that repeat the last step's adapter layout reuse its LoRA metadata (and the
kernel plan on it); any change of adapter, token count or pool rows builds a new one."""

from __future__ import annotations

import os

from support.peft_adapters import make_adapter

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.request import Request  # noqa: E402


def test_prepare_step_reuses_an_unchanged_layout_only(tmp_path):
    hf = save_tiny_model(tmp_path / "base", "llama", seed=3)
    dirs = [
        make_adapter(hf, tmp_path / f"a{i}", seed=10 + i, r=4, lora_alpha=8, target_modules="all-linear")
        for i in range(2)
    ]  # fmt: skip
    llm = LLM(str(tmp_path / "base"), dtype="float32", max_loras=2, max_lora_rank=8)
    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    outs = llm.generate([[5, 6, 7], [8, 9]], sp, adapters=dirs)  # both adapters now resident
    assert all(len(o.outputs[0].token_ids) == 2 for o in outs)
    runtime = llm.core.lora_runtime
    keys = runtime.resident_adapters
    assert len(keys) == 2

    def reqs(*adapter_keys):
        out = []
        for i, key in enumerate(adapter_keys):
            r = Request(f"r{i}", [1, 2, 3], SamplingParams())
            r.adapter_key = key
            out.append(r)
        return out

    first = runtime.prepare_step(reqs(keys[0], None, keys[1]), [1, 1, 1])
    first.sgmv_plan = "kept"  # the kernels' plan rides on the reused object
    again = runtime.prepare_step(reqs(keys[0], None, keys[1]), [1, 1, 1])
    assert again is first and again.sgmv_plan == "kept"
    swapped = runtime.prepare_step(reqs(keys[1], None, keys[0]), [1, 1, 1])
    assert swapped is not first and swapped.sgmv_plan is None
    longer = runtime.prepare_step(reqs(keys[1], None, keys[0]), [1, 1, 2])
    assert longer is not swapped and longer.num_tokens == 4
    assert runtime.prepare_step(reqs(None, None), [1, 1]) is None

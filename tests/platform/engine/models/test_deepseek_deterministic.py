"""The deterministic mode on a DeepSeek (MLA) model is refused when the engine is built, naming
multi-head latent attention, not at the first request; the same rule answers the control plane
from the base model's config."""

from __future__ import annotations

import pytest

from loraplex.platform.engine_spec.config import deterministic_gap

pytest.importorskip("transformers")


def test_deterministic_deepseek_is_refused_at_build_naming_mla(tmp_path):
    from test_deepseek_models import save_deepseek

    from loraplex.platform.engine import LLM

    save_deepseek(tmp_path, "v2_lite_greedy")
    with pytest.raises(NotImplementedError, match="multi-head latent attention"):
        LLM(str(tmp_path), dtype="float32", block_size=4, deterministic=True)


def test_the_one_rule_names_mla_from_a_model_config() -> None:
    mla = {"model_type": "deepseek_v3", "kv_lora_rank": 32}
    assert "multi-head latent attention" in (
        deterministic_gap(None, "auto", model_config=mla) or ""
    )
    assert deterministic_gap(None, "auto", model_config={"model_type": "llama"}) is None


@pytest.mark.parametrize(
    "option, reason",
    [
        (dict(kv_cache_dtype="fp8"), "fp8 KV cache.*multi-head latent attention"),
        (dict(quantization="int8"), "quantized weights.*int8.*multi-head latent attention"),
    ],
    ids=["fp8_kv", "int8_weights"],
)
def test_what_mla_does_not_serve_is_refused_at_build_naming_why(tmp_path, option, reason):
    """fp8 KV and quantized weights on an MLA model: refused when the engine is built (not at
    the first request), saying what and on which attention."""
    from test_deepseek_models import save_deepseek

    from loraplex.platform.engine import LLM

    save_deepseek(tmp_path, "v2_lite_greedy")
    with pytest.raises(NotImplementedError, match=reason):
        LLM(str(tmp_path), dtype="float32", block_size=4, **option)
